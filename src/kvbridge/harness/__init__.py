"""Task-level retention: does the target still solve the task from a transferred cache?

``kvbridge harness`` as a Python API. Modules:

- :mod:`~kvbridge.harness.protocol`: what a task is (items, scoring; tasks are plugins registered
  through ``kvbridge_register_tasks``);
- :mod:`~kvbridge.harness.conditions`: target, source, transferred, plain reuse, no context and the
  recompute points, answering log-likelihood and generation requests from a prefix cache;
- :mod:`~kvbridge.harness.run`: run tasks under the conditions; :mod:`~kvbridge.stats`: Wilson
  intervals, retention, floor-normalised retention, gap closed, paired differences;
- :mod:`~kvbridge.harness.report`: terminal table, JSON, Markdown and PNG;
- :mod:`~kvbridge.harness.tasks`: the built-in tasks (recall, mc, humaneval);
  :mod:`~kvbridge.harness.sandbox`: running generated code in a limited subprocess;
- :mod:`~kvbridge.harness.lm_eval_model`: the lm-evaluation-harness model ``kvbridge``;
- :mod:`~kvbridge.harness.session`: a conversation that switches model mid-way by mapping the cache.

Importing this package imports nothing heavy.
"""
