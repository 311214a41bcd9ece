"""KV steering: change what a model does by editing its cache, measure it, move vectors across models.

- :mod:`~kvbridge.steer.pairs`: contrastive pairs (JSONL of texts or chat turns), positions read;
- :mod:`~kvbridge.steer.vectors`: K/V (and residual) directions by mean difference or PCA, the
  random control, transfer through a fitted mapping;
- :mod:`~kvbridge.steer.artifact`: vector folders (safetensors + versioned manifest; another
  model is refused);
- :mod:`~kvbridge.steer.edit`: one-shot cache edits (add, scale, mix);
- :mod:`~kvbridge.steer.methods`: steering methods (plugin kind) and the built-ins;
- :mod:`~kvbridge.steer.scorers`: behaviour scorers (plugin kind) and the built-ins;
- :mod:`~kvbridge.steer.hooks`: residual-stream capture and activation addition;
- :mod:`~kvbridge.steer.prompts`, :mod:`~kvbridge.steer.sample`, :mod:`~kvbridge.steer.evaluate`:
  prompts and guides, batched sampling with fixed seeds and teacher-forced costs, the arms of
  ``kvbridge steer eval``;
- :mod:`~kvbridge.steer.settings`, :mod:`~kvbridge.steer.stages`: one settings object and one call
  per ``kvbridge steer`` subcommand.

Importing this package imports nothing heavy.
"""
