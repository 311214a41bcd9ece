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

import contextlib
import time
from dataclasses import dataclass, field, replace

import torch

from kvbridge.divergence import first_divergence_steps
from kvbridge.errors import KVBridgeError
from kvbridge.attention import attention_cosines, attention_output, capture_attention  # noqa: F401 (re-exported)

#: every condition, in report order
CONDITIONS = ("native", "transferred", "no_prefix", "zeroed", "shuffled", "random", "no_rope_reapply", "source")
#: conditions whose prefix is a target-geometry cache (attention cosine applies)
CACHE_CONDITIONS = ("native", "transferred", "zeroed", "shuffled", "random", "no_rope_reapply")
#: the controls a transfer must beat
CONTROLS = ("zeroed", "shuffled", "random", "no_rope_reapply")


class EvalError(KVBridgeError):
    """The evaluation cannot run as asked (too few samples, mismatched models)."""


@dataclass(frozen=True)
class EvalConfig:
    prefix_len: int = 64
    continuation_len: int = 32
    greedy_tokens: int = 16
    batch_size: int = 16
    top_k: int = 5  # top-k overlap
    top_p: float = 0.9  # nucleus for the total-variation distance
    seed: int = 0  # random control
    conditions: tuple = CONDITIONS
    attention: bool = True
    bootstrap: int = 1000  # paired bootstrap resamples of the samples (0: no intervals)

    @property
    def sample_len(self) -> int:
        return self.prefix_len + self.continuation_len + 1


@dataclass
class ConditionRun:
    """Per-condition arrays over samples (leading dim N) plus the run's context."""

    config: EvalConfig
    fields: dict  # condition -> {name: Tensor[N, ...]}
    num_layers: int  # target layers (attention cosine columns)
    timing: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return int(next(iter(self.fields["native"].values())).shape[0])


def position_fields(
    logits: torch.Tensor, targets: torch.Tensor, native: dict | None, *, top_k: int, top_p: float
) -> dict:
    """Per-position arrays of one batch of one condition (``logits [B, C, V]``; float64 math).

    One log-softmax per condition; its ``exp`` gives the probabilities the nucleus truncates
    (the same for native and every condition, so native against itself is exactly 0), and the
    argmax is taken once.
    """
    from kvbridge import divergence as dv

    logp = dv.log_probs(logits)
    argmax = logp.argmax(-1)
    out = {
        "nll": -logp.gather(-1, targets[..., None]).squeeze(-1),
        "correct": (argmax == targets).float(),
    }
    if native is None:  # this is the native condition: keep what the others compare with
        probs = logp.exp()
        return out, {
            "logp": logp,
            "probs": probs,
            "logits": logits.double(),
            "argmax": argmax,
            "topk": dv.topk_indices(logp, top_k),
            "nucleus": dv.nucleus(probs, top_p),
        }
    if logp.shape[-1] != native["logp"].shape[-1]:
        nan = torch.full(targets.shape, float("nan"))
        out.update(kl=nan, top1=nan, topk=nan, tv=nan, max_abs_logit_diff=torch.full(targets.shape[:1], float("nan")))
        return out, None
    out["kl"] = dv.kl(None, None, logp=native["logp"], logq=logp, p=native.get("probs"))
    out["top1"] = (argmax == native["argmax"]).float()
    out["topk"] = dv.topk_overlap(native["logp"], logp, top_k, p_topk=native["topk"]).float()
    out["tv"] = dv.tv(native["nucleus"], dv.nucleus(logp.exp(), top_p))
    out["max_abs_logit_diff"] = (logits.double() - native["logits"]).abs().flatten(1).max(dim=1).values
    return out, None


def native_fields(logits: torch.Tensor, targets: torch.Tensor, *, top_k: int, top_p: float) -> tuple[dict, dict]:
    """The reference condition's per-position arrays, its comparisons with itself included (exact
    by definition: KL 0, same argmax, full top-k overlap, TV 0, no logit difference), and what the
    other conditions compare with."""
    fields, native = position_fields(logits, targets, None, top_k=top_k, top_p=top_p)
    zeros = torch.zeros(targets.shape, dtype=torch.float64)
    ones = torch.ones(targets.shape, dtype=torch.float64)
    fields.update(
        kl=zeros,
        top1=ones,
        topk=ones * (min(top_k, logits.shape[-1]) / top_k),
        tv=zeros,
        max_abs_logit_diff=torch.zeros(targets.shape[:1], dtype=torch.float64),
    )
    return fields, native


# -- running the models -----------------------------------------------------------------------------
def _greedy(model, cache, first, steps: int) -> torch.Tensor:
    from transformers import DynamicCache

    cache = DynamicCache() if cache is None else cache
    toks, inp = [], first
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=inp, cache=cache, use_cache=True).logits
            inp = logits[:, -1].argmax(-1, keepdim=True)
            toks.append(inp)
    return torch.cat(toks, dim=1)


def _continue(model, cache, cont, steps: int, fresh=None, capture: bool | int = False) -> tuple:
    """Teacher-forced logits of ``cont`` from ``cache``, and ``steps`` greedy tokens from the prefix.

    The greedy run reuses the teacher-forced forward: step 0 is the argmax of continuation
    position 0, and the cache is cropped back to prefix + that token (no second inject, no
    repeated forward). ``fresh()`` gives a new cache for the plain re-run where a cache type
    cannot be cropped. ``capture``: record the attention of the teacher-forced forward only
    (:func:`capture_attention`; an int: of that many leading batch rows); returns
    ``(logits, tokens, captured or None)``.
    """
    from transformers import DynamicCache

    cache = DynamicCache() if cache is None else cache
    rows = None if capture is True else int(capture) if capture else None
    with torch.no_grad(), capture_attention(model, rows) if capture else contextlib.nullcontext() as captured:
        logits = model(input_ids=cont, cache=cache, use_cache=True).logits.float()
    c = cont.shape[1]
    try:
        if c > 1:
            cache.crop(-(c - 1))
        ok = cache.get_seq_length() >= 1
    except Exception:  # a cache type without crop (sliding windows, hybrids): run greedy afresh
        ok = False
    if not ok or steps < 1:
        return logits, _greedy(model, fresh() if fresh else None, cont[:, :1], steps), captured
    first = logits[:, 0].argmax(-1, keepdim=True)
    toks = torch.cat([first, _greedy(model, cache, first, steps - 1)], dim=1) if steps > 1 else first
    return logits, toks, captured


def capture_rows(captured: dict, b: int, rows: int) -> dict:
    """The first ``b`` batch rows of an attention capture of ``rows`` rows (native's, in a stacked forward)."""
    if rows == b:
        return captured

    def cut(t):
        return t[:b] if t is not None and t.dim() and t.shape[0] == rows else t

    return {
        layer: {k: cut(v) if isinstance(v, torch.Tensor) else v for k, v in c.items()} for layer, c in captured.items()
    }


def _rows(state, start: int, stop: int):
    """Batch rows ``[start:stop]`` of a state (views)."""

    def cut(t):
        return t if t is None or t.shape[0] == 1 and state.batch_size != 1 else t[start:stop]

    return replace(
        state,
        keys=tuple(k[start:stop] for k in state.keys),
        values=tuple(v[start:stop] for v in state.values),
        token_ids=state.token_ids[start:stop],
        positions=cut(state.positions),
        rope_lengths=cut(state.rope_lengths),
    )


def _cat_states(states: list):
    """The states stacked along the batch (one cache for several conditions); None when they differ in kind."""
    first = states[0]
    b = first.batch_size

    def rows(t):
        return t.expand(b, -1) if t.shape[0] == 1 else t

    index_layers = [i for i, _ in first.indexer_keys]
    for s in states[1:]:
        if (
            s.rope_applied != first.rope_applied
            or (s.rope_lengths is None) != (first.rope_lengths is None)
            or s.states
            or s.batch_size != b
            or s.num_tokens != first.num_tokens
            or [i for i, _ in s.indexer_keys] != index_layers
        ):
            return None
    lengths = None if first.rope_lengths is None else torch.cat([rows(s.rope_lengths) for s in states])
    index = tuple((i, torch.cat(ts)) for i, *ts in zip(index_layers, *([t for _, t in s.indexer_keys] for s in states)))
    return replace(
        first,
        keys=tuple(torch.cat(ks) for ks in zip(*(s.keys for s in states))),
        values=tuple(torch.cat(vs) for vs in zip(*(s.values for s in states))),
        token_ids=torch.cat([s.token_ids for s in states]),
        positions=torch.cat([rows(s.positions) for s in states]),
        rope_lengths=lengths,
        indexer_keys=index,
        approximate=any(s.approximate for s in states),
    )


#: logits of one batched continuation forward are kept under this many bytes (conditions are
#: grouped to fit: rows x continuation x vocabulary x 4)
LOGITS_BUDGET = 1 << 30


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


def _check_pair(source_spec, target_spec, mapping) -> None:
    ms, mt = getattr(mapping, "source_spec", None), getattr(mapping, "target_spec", None)
    for role, want, got in (("source", ms, source_spec), ("target", mt, target_spec)):
        if want is None:
            continue
        g1 = (want.num_layers, want.num_kv_heads, want.head_dim)
        g2 = (got.num_layers, got.num_kv_heads, got.head_dim)
        if g1 != g2:
            raise EvalError(
                f"the mapping was fitted for a {role} with (layers, kv_heads, head_dim)={g1}, "
                f"the {role} model has {g2}",
                "pass the mapping fitted for this pair",
            )


def run_conditions(
    source,
    target,
    mapping,
    samples: torch.Tensor,
    config: EvalConfig = EvalConfig(),
    *,
    host=None,
    progress=None,
    on_batch=None,
) -> ConditionRun:
    """Run every condition of ``config`` on ``samples [N, P+C+1]`` and reduce to per-sample arrays.

    ``on_batch(first, last, {condition: {name: Tensor of this batch}})`` after each batch (partial results).
    """
    from kvbridge.plugins import get_host
    from kvbridge.transfer import transfer

    host = host or get_host()
    samples = torch.as_tensor(samples).long()
    p, c = config.prefix_len, config.continuation_len
    if samples.dim() != 2 or samples.shape[1] < config.sample_len:
        raise EvalError(
            f"samples must be [N, >= {config.sample_len}] token ids (prefix {p} + continuation {c} + 1), "
            f"got {tuple(samples.shape)}",
            "make longer samples or lower --prefix-len/--continuation-len",
        )
    n = samples.shape[0]
    conds = [x for x in CONDITIONS if x in config.conditions]
    if "native" not in conds:
        conds.insert(0, "native")
    if "shuffled" in conds and n < 2:
        raise EvalError("the shuffled control needs at least 2 samples", "pass --samples 2 or more")
    if p < 1 or c < 1:
        raise EvalError(
            f"prefix and continuation need at least 1 token (got {p}, {c})", "raise --prefix-len/--continuation-len"
        )
    sad = host.adapter_for(source.config.to_dict())
    tad = host.adapter_for(target.config.to_dict())
    sspec, tspec = sad.spec_of(source), tad.spec_of(target)
    _check_pair(sspec, tspec, mapping)
    gen = torch.Generator().manual_seed(int(config.seed))
    acc: dict = {x: {} for x in conds}
    timing = {"target_prefill_s": 0.0, "transfer_s": 0.0, "source_prefill_s": 0.0, "prefix_tokens": 0}
    notes = []
    shuffled = "shuffled" in conds
    t_start = time.perf_counter()

    def add(cond, name, value):
        acc[cond].setdefault(name, []).append(value.detach().float().cpu())

    for start in range(0, n, config.batch_size):
        idx = torch.arange(start, min(n, start + config.batch_size))
        ids = samples[idx, : config.sample_len]
        prefix, cont, targets = ids[:, :p], ids[:, p : p + c], ids[:, p + 1 : p + c + 1]
        t0 = time.perf_counter()
        native_state = tad.extract(target, prefix, spec=tspec)
        t1 = time.perf_counter()
        # one source prefill serves the transferred cache and the shuffled control (the next sample's prefix)
        src_rows = torch.cat([prefix, samples[(idx[-1:] + 1) % n, :p]]) if shuffled else prefix
        src_state = sad.extract(source, src_rows, spec=sspec)
        t2 = time.perf_counter()
        transferred = transfer(src_state, mapping, tspec, host=host)
        t3 = time.perf_counter()
        timing["target_prefill_s"] += t1 - t0
        timing["source_prefill_s"] += t2 - t1
        timing["transfer_s"] += t3 - t2
        timing["prefix_tokens"] += int(prefix.numel())
        b = len(idx)
        if shuffled:  # the source ran one more row: the next sample's prefix (the shuffled control)
            shuffled_state = _rows(transferred, 1, b + 1)
            transferred, src_state = _rows(transferred, 0, b), _rows(src_state, 0, b)

        states = {"native": native_state, "transferred": transferred}
        if "zeroed" in conds:
            states["zeroed"] = zeroed_state(transferred)
        if shuffled:
            states["shuffled"] = shuffled_state
        if "random" in conds:
            states["random"] = random_state(transferred, gen)
        if "no_rope_reapply" in conds:
            states["no_rope_reapply"] = no_rope_state(src_state, mapping, tspec, host=host)

        # every cache condition, native first, stacked along the batch: one teacher-forced forward and one greedy
        # loop per group (groups sized by LOGITS_BUDGET); native's logits are what every other one is compared with
        cached = ["native"] + [x for x in conds if x in states and x != "native"]
        vocab = int(getattr(target.config, "vocab_size", 0) or tspec.vocab_size or 1)
        per_group = max(1, LOGITS_BUDGET // max(1, b * c * vocab * 4))
        parts = []
        for g0 in range(0, len(cached), per_group):
            group = tuple(cached[g0 : g0 + per_group])
            stacked = _cat_states([states[x] for x in group]) if len(group) > 1 else states[group[0]]
            if stacked is not None:
                parts.append((group, stacked))
            elif group[0] == "native" and len(group) > 2 and _cat_states([states[x] for x in group[1:]]) is not None:
                parts += [(group[:1], states["native"]), (group[1:], _cat_states([states[x] for x in group[1:]]))]
            else:  # states of different kinds: one forward each
                parts += [((x,), states[x]) for x in group]
        native = ref_greedy = captured = None

        def score(cond, logits, toks):
            fields, _ = position_fields(logits, targets, native, top_k=config.top_k, top_p=config.top_p)
            for name, value in fields.items():
                add(cond, name, value)
            add(cond, "greedy_div", first_divergence_steps(toks, ref_greedy))

        for names, state in parts:
            logits, toks, cap = _continue(
                target,
                tad.inject(state, target),
                cont.repeat(len(names), 1),
                config.greedy_tokens,
                fresh=lambda st=state: tad.inject(st, target, check=False),
                capture=b if config.attention and names[0] == "native" else False,
            )
            for j, cond in enumerate(names):
                rows_logits, rows_toks = logits[j * b : (j + 1) * b], toks[j * b : (j + 1) * b]
                if cond != "native":
                    score(cond, rows_logits, rows_toks)
                    if captured is not None:
                        add(cond, "attn_cos", attention_cosines(captured, states[cond], p))
                    continue
                ref_greedy = rows_toks
                fields, native = native_fields(rows_logits, targets, top_k=config.top_k, top_p=config.top_p)
                for name, value in fields.items():
                    add("native", name, value)
                add("native", "greedy_div", torch.full((len(idx),), float(config.greedy_tokens)))
                if cap is not None:
                    captured = capture_rows(cap, b, len(names) * b)
                    add("native", "attn_cos", attention_cosines(captured, native_state, p))
            del logits
        if "no_prefix" in conds:
            logits, toks, _ = _continue(target, None, cont, config.greedy_tokens)
            score("no_prefix", logits, toks)
        if "source" in conds:
            logits, toks, _ = _continue(
                source,
                sad.inject(src_state, source),
                cont,
                config.greedy_tokens,
                fresh=lambda: sad.inject(src_state, source),
            )
            score("source", logits, toks)
        if on_batch is not None:
            on_batch(
                start, min(n, start + config.batch_size), {x: {k: v[-1] for k, v in acc[x].items()} for x in conds}
            )
        if progress is not None:
            progress(min(n, start + config.batch_size), n)

    out = {cond: {name: torch.cat(vals, dim=0) for name, vals in acc[cond].items()} for cond in conds}
    for cond in conds:  # references every condition's metrics need (paired: same samples)
        out[cond]["native_nll"] = out["native"]["nll"]
        out[cond]["native_correct"] = out["native"]["correct"]
        if "no_prefix" in out:
            out[cond]["no_prefix_nll"] = out["no_prefix"]["nll"]
            out[cond]["no_prefix_correct"] = out["no_prefix"]["correct"]
    if "source" in conds and sspec.vocab_size != tspec.vocab_size:
        notes.append(
            f"source vocabulary {sspec.vocab_size} != target {tspec.vocab_size}: "
            "no logit comparison for the source condition"
        )
    timing["eval_s"] = time.perf_counter() - t_start
    return ConditionRun(config=config, fields=out, num_layers=tspec.num_layers, timing=timing, notes=notes)


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
