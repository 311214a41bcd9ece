"""The evaluation conditions: one target model continued from different prefix caches.

Every condition runs on the same held-out samples. A sample is ``P + C + 1`` token ids:

- the **prefix** ``x[0:P]`` is what the cache holds (P tokens, positions ``0..P-1``);
- the **continuation** ``x[P:P+C]`` is fed to the target by teacher forcing from that cache
  (positions ``P..P+C-1``); the logits at continuation position ``j`` predict ``x[P+j+1]``, so
  ``C`` next-token predictions are scored per sample, all conditioned on the prefix cache;
- **greedy generation**: from a fresh copy of the same cache, the first continuation token
  ``x[P]`` is fed, then ``G`` tokens are chosen greedily; step 0 is the argmax of continuation
  position 0.

The conditions (all target-geometry caches of the same P tokens unless said otherwise):

- ``native``: the target's own prefill of the prefix (the ceiling);
- ``transferred``: the source's prefix cache through the mapping
  (:func:`kvbridge.transfer.transfer`: strip the source RoPE, map, apply the target RoPE);
- ``no_prefix``: the target fed the continuation alone, from position 0 (the floor);
- ``zeroed``: the transferred cache with every K and V set to 0 (a zero key still takes part
  in the softmax with score 0, so this is not the same as ``no_prefix``);
- ``shuffled``: the transferred cache of a *different* sample's prefix (sample ``(i+1) mod N``):
  right statistics, wrong content;
- ``random``: Gaussian noise with the transferred cache's per-layer mean and standard
  deviation (one scalar pair per layer for K and one for V, over the whole batch chunk);
- ``no_rope_reapply``: the mapped content-space keys injected as if they were rotated (the
  target RoPE is never applied): the pitfall of skipping target re-rotation;
- ``source``: the source model continued from its own prefix cache (reference; its logits
  are compared with the target's native ones only when both share the vocabulary size).

:func:`run_conditions` returns per-sample, per-position arrays (:class:`ConditionRun`), from
which :mod:`kvbridge.evaluate.metrics` computes every metric and its bootstrap interval.
Logits are reduced as soon as a batch is done (they are not kept), so memory is
``O(batch x C x vocab)``.

Attention-output cosine (per target layer): during the native continuation (native's rows of
the stacked teacher-forced forward) a capturing attention function (registered with
transformers' ``AttentionInterface`` and enabled on the target only for that forward) records, per layer, the post-RoPE queries of the continuation
tokens, the full keys/values the layer attended to (prefix + continuation) and the mask. For
each condition that has a prefix cache, the prefix slice ``[:P]`` of those keys/values is
replaced by the condition's cached K/V and attention is recomputed with the *same* queries,
continuation K/V and mask; the cosine between the two attention outputs (all query heads
concatenated, before ``o_proj``) is taken per continuation token and averaged per sample.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from kvbridge.attention import attention_cosines, attention_output, capture_attention  # noqa: F401 (re-exported)
from kvbridge.evaluate.fields import native_fields, position_fields  # noqa: F401 (re-exported)
from kvbridge.evaluate.settings import CACHE_CONDITIONS, CONDITIONS, CONTROLS, EvalError, EvalSettings
from kvbridge.evaluate.runner import Built, Condition, Prefills, prefix_batches, run_batches, sample_ids


def EvalConfig(**fields):  # noqa: N802 - the class it replaces
    """Deprecated: an :class:`~kvbridge.evaluate.settings.EvalSettings` (eval's one settings type), with
    the old ``EvalConfig`` default ``continuation_len=32``."""
    import warnings

    warnings.warn("EvalConfig is deprecated: use kvbridge.evaluate.settings.EvalSettings", DeprecationWarning, 2)
    return EvalSettings(**{"continuation_len": 32, **fields})


@dataclass
class ConditionRun:
    """Per-condition arrays over samples (leading dim N) plus the run's context."""

    config: EvalSettings
    fields: dict  # condition -> {name: Tensor[N, ...]}
    num_layers: int  # target layers (attention cosine columns)
    timing: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return int(next(iter(self.fields["native"].values())).shape[0])


# -- the condition set -----------------------------------------------------------------------------
def zeroed_state(state):
    return state.map_tensors(torch.zeros_like)


def random_state(state, generator: torch.Generator):
    """Noise with the per-layer mean and std of ``state`` (K and V apart)."""

    def noise(t):
        mean, std = t.float().mean(), t.float().std()
        return (torch.randn(t.shape, generator=generator) * std + mean).to(t.dtype)

    return replace(
        state, keys=tuple(noise(k) for k in state.keys), values=tuple(noise(v) for v in state.values), approximate=True
    )


def no_rope_state(source_state, mapping, target_spec, host=None):
    """The mapped cache with content-space keys injected as if rotated (no target RoPE)."""
    content = source_state.strip_rope(host=host)
    mapped = mapping.map_content(content, target_spec).to(dtype=getattr(torch, target_spec.dtype, content.dtype))
    return replace(mapped, rope_applied=True, positions=source_state.positions, rope_lengths=None, approximate=True)


def run_conditions(
    source,
    target,
    mapping,
    samples: torch.Tensor,
    config: EvalSettings | None = None,
    *,
    host=None,
    progress=None,
    on_batch=None,
    extra=(),
) -> ConditionRun:
    """Run every condition of ``config`` (an :class:`~kvbridge.evaluate.settings.EvalSettings`, default
    ``kvbridge eval``'s) on ``samples [N, P+C+1]``; per-sample arrays.

    ``on_batch(first, last, {condition: {name: Tensor of this batch}})`` after each batch (partial results).
    ``extra``: more conditions, each a function of the run's :class:`~kvbridge.evaluate.runner.Prefills`
    returning a :class:`~kvbridge.evaluate.runner.Condition` (run after ``config``'s, on the same prefills).
    """
    config = config or EvalSettings()
    samples, p, c = sample_ids(samples, config.prefix_len, config.continuation_len, EvalError)
    n = samples.shape[0]
    conds = [x for x in CONDITIONS if x in ("native", *config.condition_names())]  # native: always run
    if "shuffled" in conds and n < 2:
        raise EvalError("the shuffled control needs at least 2 samples", "pass --samples 2 or more")
    pre = Prefills(source, target, mapping, host=host, error=EvalError)
    sspec, tspec = pre.sspec, pre.tspec
    gen = torch.Generator().manual_seed(int(config.seed))
    pre.timing["prefix_tokens"] = n * p
    builders = {
        "zeroed": lambda bt: Built(zeroed_state(pre.transferred(bt))),
        "shuffled": lambda bt: Built(pre.transferred(bt, shifted=True)),
        "random": lambda bt: Built(random_state(pre.transferred(bt), gen)),
        "no_rope_reapply": lambda bt: Built(no_rope_state(pre.source_state(bt), mapping, tspec, host=pre.host)),
    }

    def after(batch, acc):
        if on_batch is not None:
            last = int(batch.index[-1]) + 1
            on_batch(int(batch.index[0]), last, {x: {k: v[-1] for k, v in acc[x].items()} for x in conds})

    t_start = time.perf_counter()
    conditions = [Condition(x, builders[x]) if x in builders else pre.conditions(x)[0] for x in conds]
    conditions += [make(pre) for make in extra]
    conds += [x.name for x in conditions[len(conds) :]]
    out, _ = run_batches(
        conditions,
        prefix_batches(samples, p, c, config.batch_size, pre.timing, shifted="shuffled" in conds),
        pre.models,
        top_k=config.top_k,
        top_p=config.top_p,
        attention=config.attention,
        greedy=config.greedy_tokens,
        progress=progress,
        after_batch=after,
    )
    notes = []
    if "source" in conds and sspec.vocab_size != tspec.vocab_size:
        notes.append(
            f"source vocabulary {sspec.vocab_size} != target {tspec.vocab_size}: "
            "no logit comparison for the source condition"
        )
    pre.timing["eval_s"] = time.perf_counter() - t_start
    return ConditionRun(config=config, fields=out, num_layers=tspec.num_layers, timing=pre.timing, notes=notes)


__all__ = [
    "CONDITIONS",
    "CACHE_CONDITIONS",
    "CONTROLS",
    "EvalConfig",
    "ConditionRun",
    "EvalError",
    "run_conditions",
    "capture_attention",
    "attention_output",
    "attention_cosines",
    "position_fields",
    "zeroed_state",
    "random_state",
    "no_rope_state",
]
