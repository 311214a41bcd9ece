"""One condition runner: a target model continued from different prefix caches, on the same samples.

A **condition** is any object with a ``name`` and ``build(batch) -> Built``: the prefix cache it
continues from for one batch of samples (``None``: no cache), the model that continues (``on``:
``"target"`` or ``"source"``), extra forward arguments, and what it cost (FLOPs, seconds, rows
computed). The first condition is the **reference** (the native or full prefill): its logits are
what every other condition is compared with, and its attention is captured for the
attention-output cosine. What conditions share (the native prefill, the source prefill, the
transferred cache) is computed once per batch through :meth:`Batch.once`, which also times it.

:func:`run_batches` scores every condition on every batch (:mod:`kvbridge.evaluate.fields`) and
returns the per-condition batches and costs; ``kvbridge eval``'s conditions, the recompute curve,
the compute frontier and the graft are condition sets over it. Two ways to run the forwards:

- ``greedy=None``: one teacher-forced forward per condition, built, scored and dropped one at a
  time (memory: one extra cache);
- ``greedy=G`` (``kvbridge eval``): the target-cache conditions stacked along the batch (groups
  sized by :data:`LOGITS_BUDGET`), one forward and one greedy loop of ``G`` tokens per group; the
  first greedy step that leaves the reference's tokens is kept per sample.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from kvbridge.errors import KVBridgeError
from kvbridge.attention import attention_cosines, capture_attention

#: logits of one batched continuation forward are kept under this many bytes (conditions are
#: grouped to fit: rows x continuation x vocabulary x 4)
LOGITS_BUDGET = 1 << 30


@dataclass
class Batch:
    """One batch: sample ``index``, teacher-forced ``inputs`` and their next-token ``targets``
    (``[B, C]``), the condition set's own slices (``parts``: prefix, context, chunk...), the
    run-wide ``timing`` (seconds per shared prefill) and the run's sample count (``total``)."""

    index: torch.Tensor
    inputs: torch.Tensor
    targets: torch.Tensor
    parts: dict
    timing: dict
    total: int = 0
    memo: dict = field(default_factory=dict)

    def once(self, key: str, make: Callable[[], Any], timer: str | None = None):
        """``make()`` on the first call for ``key`` in this batch (timed into ``timing[timer]``), then reused."""
        if key not in self.memo:
            t0 = time.perf_counter()
            self.memo[key] = make()
            if timer:
                self.timing[timer] = self.timing.get(timer, 0.0) + time.perf_counter() - t0
        return self.memo[key]


@dataclass(frozen=True)
class Built:
    """What one condition continues from in one batch, and what it cost."""

    state: Any = None  # the prefix cache (a KVState), None: the continuation alone
    on: str = "target"  # the model that continues: "target" or "source"
    kwargs: dict = field(default_factory=dict)  # extra forward arguments (position_ids)
    seconds: float = 0.0
    flops: float = 0.0
    rows: int | None = None  # prefix rows the condition computed


@dataclass(frozen=True)
class Condition:
    """A named condition: ``build(batch) -> Built`` (any object with both follows the protocol)."""

    name: str
    build: Callable[[Batch], Built]


def sample_ids(samples, prefix_len: int, continuation_len: int, error=KVBridgeError) -> tuple[torch.Tensor, int, int]:
    """``(samples as long [N, T], P, C)``; refused in one line (``error``) unless ``T >= P + C + 1``."""
    samples, p, c = torch.as_tensor(samples).long(), int(prefix_len), int(continuation_len)
    if samples.dim() != 2 or samples.shape[1] < p + c + 1:
        raise error(
            f"samples must be [N, >= {p + c + 1}] token ids (prefix {p} + continuation {c} + 1), "
            f"got {tuple(samples.shape)}",
            "make longer samples or lower --prefix-len/--continuation-len",
        )
    return samples, p, c


def prefix_batches(samples, prefix_len: int, continuation_len: int, batch_size: int, timing: dict, shifted=False):
    """:class:`Batch` es of ``samples [N, >= P+C+1]``: prefix ``[:P]``, continuation ``[P:P+C]`` scored;
    ``shifted``: the last sample's successor's prefix as ``parts["source_extra"]``, for the source to prefill
    with the batch (the shuffled control, :meth:`Prefills.transferred` ``shifted=True``)."""
    p, c, n = prefix_len, continuation_len, samples.shape[0]
    for start in range(0, n, batch_size):
        idx = torch.arange(start, min(n, start + batch_size))
        ids = samples[idx, : p + c + 1]
        parts = {"prefix": ids[:, :p], **({"source_extra": samples[(idx[-1:] + 1) % n, :p]} if shifted else {})}
        yield Batch(idx, ids[:, p : p + c], ids[:, p + 1 : p + c + 1], parts, timing, n)


def batch_rows(state, start: int, stop: int):
    """Batch rows ``[start:stop]`` of a state (views; the state itself when that is all of it)."""
    if start == 0 and stop == state.batch_size:
        return state

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


FIX = "pass the mapping fitted for this pair"


def check_mapping(sspec, tspec, mapping, error=KVBridgeError, fix: str = FIX):
    """Refuse (one line, ``error``) a mapping fitted for a source or target of another geometry."""
    from kvbridge.transfer import content_geometry as geometry

    for role, want, got in (
        ("source", getattr(mapping, "source_spec", None), sspec),
        ("target", getattr(mapping, "target_spec", None), tspec),
    ):
        if want is not None and geometry(want) != geometry(got):
            raise error(
                f"the mapping was fitted for a {role} with (layers, kv_heads, head_dim)={geometry(want)}, "
                f"the {role} model has {geometry(got)}",
                fix,
            )


class Prefills:
    """What a pair's conditions share on a batch's prefix, each computed once per batch and timed:
    the target's prefill (``native``), the source's (``source_state``) and its transfer
    (``transferred``). ``source_hook(run) -> (state, extra)`` wraps the source prefill (e.g. to
    capture its hidden states). A mapping fitted for another geometry is refused here, for every
    condition set (``error`` and ``fix``: the stage's one-line error)."""

    def __init__(self, source, target, mapping, *, host=None, source_hook=None, error=KVBridgeError, fix=FIX):
        from kvbridge.plugins import get_host

        self.host, self.mapping, self.hook = host or get_host(), mapping, source_hook
        self.source, self.target = source, target
        self.sad, self.tad = self.host.adapter_of(source), self.host.adapter_of(target)
        self.sspec, self.tspec = self.sad.spec_of(source), self.tad.spec_of(target)
        check_mapping(self.sspec, self.tspec, mapping, error, fix)
        self.models = {"target": (target, self.tad), "source": (source, self.sad)}
        self.timing = {"target_prefill_s": 0.0, "transfer_s": 0.0, "source_prefill_s": 0.0}

    def native(self, bt: Batch):
        make = lambda: self.tad.extract(self.target, bt.parts["prefix"], spec=self.tspec)  # noqa: E731
        return bt.once("native", make, "target_prefill_s")

    def _source(self, bt: Batch):
        def make():
            ids = bt.parts["prefix"]
            if "source_extra" in bt.parts:  # more rows in the same prefill (eval's shuffled control)
                ids = torch.cat([ids, bt.parts["source_extra"]])
            run = lambda: self.sad.extract(self.source, ids, spec=self.sspec)  # noqa: E731
            return self.hook(run) if self.hook else (run(), None)

        return bt.once("source", make, "source_prefill_s")

    def source_state(self, bt: Batch, extra: bool = False):
        """The source's prefix cache (``extra``: what ``source_hook`` captured beside it)."""
        state, captured = self._source(bt)
        return captured if extra else batch_rows(state, 0, len(bt.index))

    def transferred(self, bt: Batch, shifted: bool = False):
        """The source's prefix cache through the mapping; ``shifted``: each sample's row holds the next
        sample's prefix (the last one's is ``parts["source_extra"]``, prefilled with the batch)."""
        from kvbridge.transfer import transfer

        make = lambda: transfer(self._source(bt)[0], self.mapping, self.tspec, host=self.host)  # noqa: E731
        out, b = bt.once("transferred", make, "transfer_s"), len(bt.index)
        return batch_rows(out, 1, b + 1) if shifted else batch_rows(out, 0, b)

    def conditions(self, *names: str) -> list:
        """The shared conditions by name: native, transferred, source (the source continued), no_prefix."""
        builds = {
            "native": lambda bt: Built(self.native(bt)),
            "transferred": lambda bt: Built(self.transferred(bt)),
            "source": lambda bt: Built(self.source_state(bt), on="source"),
            "no_prefix": lambda bt: Built(None),
        }
        return [Condition(x, builds[x]) for x in names]

    def run(self, conditions, samples, prefix_len: int, continuation_len: int, batch_size: int, **options):
        """:func:`run_batches` of ``conditions`` on ``samples``' prefix batches, with this pair."""
        batches = prefix_batches(samples, prefix_len, continuation_len, batch_size, self.timing)
        return run_batches(conditions, batches, self.models, **options)


# -- the forwards -----------------------------------------------------------------------------------
def decode(model, cache, first, steps: int, pick: Callable | None = None) -> torch.Tensor:
    """``[B, 1 + steps]``: ``first`` and the ``steps`` tokens decoded after it from ``cache`` (None: a fresh
    one), each the argmax of the last logits or ``pick(logits [B, V]) -> [B, 1]`` (a sampler)."""
    from transformers import DynamicCache

    cache = DynamicCache() if cache is None else cache
    toks = [first]
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=toks[-1], cache=cache, use_cache=True).logits[:, -1]
            toks.append(logits.argmax(-1, keepdim=True) if pick is None else pick(logits))
    return torch.cat(toks, dim=1)


def _continue(model, cache, cont, steps: int | None, fresh=None, capture: bool | int = False, kwargs=None) -> tuple:
    """Teacher-forced logits of ``cont`` from ``cache`` (None: the continuation alone), and ``steps``
    greedy tokens from the prefix (None: none).

    The greedy run reuses the teacher-forced forward: step 0 is the argmax of continuation
    position 0, and the cache is cropped back to prefix + that token (no second inject, no
    repeated forward). ``fresh()`` gives a new cache for the plain re-run where a cache type
    cannot be cropped. ``capture``: record the attention of the teacher-forced forward only
    (:func:`capture_attention`; an int: of that many leading batch rows); returns
    ``(logits, tokens or None, captured or None)``.
    """
    from transformers import DynamicCache

    if cache is None and steps is not None:
        cache = DynamicCache()
    kw = {} if cache is None else {"cache": cache, "use_cache": True, **(kwargs or {})}
    rows = None if capture is True else int(capture) if capture else None
    with torch.no_grad(), capture_attention(model, rows) if capture else contextlib.nullcontext() as captured:
        logits = model(input_ids=cont, **kw).logits.float()
    if steps is None:
        return logits, None, captured
    c = cont.shape[1]
    try:
        if c > 1:
            cache.crop(-(c - 1))
        ok = cache.get_seq_length() >= 1
    except Exception:  # a cache type without crop (sliding windows, hybrids): run greedy afresh
        ok = False
    if not ok or steps < 1:
        return logits, decode(model, fresh() if fresh else None, cont[:, :1], steps)[:, 1:], captured
    return logits, decode(model, cache, logits[:, 0].argmax(-1, keepdim=True), steps - 1), captured


def capture_rows(captured: dict, b: int, rows: int) -> dict:
    """The first ``b`` batch rows of an attention capture of ``rows`` rows (native's, in a stacked forward)."""
    if rows == b:
        return captured

    def cut(t):
        return t[:b] if t is not None and t.dim() and t.shape[0] == rows else t

    return {
        layer: {k: cut(v) if isinstance(v, torch.Tensor) else v for k, v in c.items()} for layer, c in captured.items()
    }


def cat_states(states: list):
    """The states stacked along the batch (one cache for several conditions); None when they differ in kind."""
    first = states[0]
    b = first.batch_size

    def rows(t):
        return t.expand(b, -1) if t.shape[0] == 1 else t

    def layout(s):  # what states stacked along the batch must share
        return s.rope_applied, s.rope_lengths is None, s.batch_size, s.num_tokens, [i for i, _ in s.indexer_keys]

    if any(s.states or layout(s) != layout(first) for s in states[1:]):
        return None
    index_layers = [i for i, _ in first.indexer_keys]
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


def _stacked_parts(names: list, states: dict, per_group: int) -> list:
    """``[(names, state)]``: the cache conditions stacked along the batch in groups of ``per_group``
    (one forward each); states of different kinds run apart."""
    parts = []
    for g0 in range(0, len(names), per_group):
        group = tuple(names[g0 : g0 + per_group])
        stacked = cat_states([states[x] for x in group]) if len(group) > 1 else states[group[0]]
        if stacked is not None:
            parts.append((group, stacked))
        elif g0 == 0 and len(group) > 2 and (rest := cat_states([states[x] for x in group[1:]])) is not None:
            parts += [(group[:1], states[group[0]]), (group[1:], rest)]  # the reference alone, the rest stacked
        else:
            parts += [((x,), states[x]) for x in group]
    return parts


def run_batches(
    conditions,
    batches,
    models: dict,
    *,
    top_k: int = 5,
    top_p: float = 0.9,
    attention: bool = True,
    greedy: int | None = None,
    progress=None,
    after_batch=None,
    floor: str = "no_prefix",
) -> tuple[dict, dict]:
    """Score every condition on every batch; ``(fields, cost)``: per-condition arrays over the samples
    (:func:`~kvbridge.evaluate.fields.stack_fields`, the reference as ceiling, ``floor`` the floor) and
    ``cost[name]`` ``{"flops", "seconds", "rows"}`` summed over batches. ``models``: ``{"target": (model,
    adapter), "source": (model, adapter)}``; ``after_batch(batch, acc)`` after each batch (its lists of
    per-batch tensors)."""
    from kvbridge.divergence import first_divergence_steps
    from kvbridge.evaluate.fields import native_fields, position_fields, stack_fields

    conditions = list(conditions)
    names = [c.name for c in conditions]
    by_name = dict(zip(names, conditions))
    ref = names[0]
    acc: dict = {x: {} for x in names}
    cost = {x: {"flops": 0.0, "seconds": 0.0, "rows": 0} for x in names}

    def add(cond, key, value):
        acc[cond].setdefault(key, []).append(value.detach().float().cpu())

    for batch in batches:
        b, targets = len(batch.index), batch.targets
        ctx: dict = {}  # the reference's logits reduced, its greedy tokens, its attention capture

        def score(name, built, logits, toks, captured=None):
            if name == ref:
                fields, ctx["native"] = native_fields(logits, targets, top_k=top_k, top_p=top_p)
                ctx["greedy"], ctx["captured"], ctx["length"] = toks, captured, built.state.num_tokens
            else:
                fields, _ = position_fields(logits, targets, ctx["native"], top_k=top_k, top_p=top_p)
            for key, value in fields.items():
                add(name, key, value)
            if greedy is not None:
                div = first_divergence_steps(toks, ctx["greedy"]) if name != ref else torch.full((b,), float(greedy))
                add(name, "greedy_div", div)
            st = built.state  # attention cosine: target caches of the reference's length
            if ctx["captured"] is not None and built.on == "target" and getattr(st, "num_tokens", -1) == ctx["length"]:
                add(name, "attn_cos", attention_cosines(ctx["captured"], st, ctx["length"]))
            c = cost[name]
            c["seconds"] += built.seconds
            c["flops"] += built.flops
            if built.rows is not None:
                c["rows"] = built.rows

        built: dict = {}
        if greedy is None:  # one condition at a time: built, scored, dropped (memory: one extra cache)
            plan = [((x,), None) for x in names]
        else:  # the target caches stacked: one forward and one greedy loop per group, the reference first
            built = {c.name: c.build(batch) for c in conditions}
            cached = [x for x in names if built[x].on == "target" and built[x].state is not None]
            vocab = int(getattr(models["target"][0].config, "vocab_size", 0) or built[ref].state.spec.vocab_size or 1)
            per_group = max(1, LOGITS_BUDGET // max(1, b * batch.inputs.shape[1] * vocab * 4))
            plan = _stacked_parts(cached, {x: built[x].state for x in cached}, per_group)
            plan += [((x,), built[x].state) for x in names if x not in cached]
        for group, state in plan:
            if group[0] not in built:
                built[group[0]] = by_name[group[0]].build(batch)
                state = built[group[0]].state
            model, ad = models[built[group[0]].on]
            logits, toks, cap = _continue(
                model,
                None if state is None else ad.inject(state, model, check=group[0] == ref),
                batch.inputs.repeat(len(group), 1),
                greedy,
                fresh=None if state is None else lambda st=state, m=model, a=ad: a.inject(st, m, check=False),
                capture=b if attention and group[0] == ref else False,
                kwargs=built[group[0]].kwargs,
            )
            for j, name in enumerate(group):
                rows = slice(j * b, (j + 1) * b)
                cap_j = capture_rows(cap, b, len(group) * b) if cap is not None and name == ref else None
                score(name, built[name], logits[rows], None if toks is None else toks[rows], cap_j)
            if greedy is None:
                del built[group[0]]
            del logits, cap
        if after_batch is not None:
            after_batch(batch, acc)
        if progress is not None:
            progress(int(batch.index[-1]) + 1, batch.total)
    return stack_fields(acc, names, ceiling=ref, floor=floor), cost


# -- item by item --------------------------------------------------------------------------------------
def run_items(conditions, items, answer: Callable, *, after_item: Callable | None = None) -> list:
    """Each of ``items`` answered under each of ``conditions`` (names or :class:`Condition` s), in order:
    ``answer(item, name)`` per pair; ``after_item(item, {name: answer})`` makes each item's record
    (default: the dict itself). The measurements that are not teacher-forced batches run here: the
    harness (an item's context prefilled per condition, the query answered from it; the conditions
    share prefills through :class:`Prefills` on a one-context :class:`Batch`) and ``steer eval`` (one
    prompt, an arm per condition, sampled over seeds)."""
    names = [getattr(c, "name", c) for c in conditions]
    after_item = after_item or (lambda item, values: values)
    return [after_item(item, {name: answer(item, name) for name in names}) for item in items]


def context_batch(ids, timing: dict, memo: dict | None = None) -> Batch:
    """A one-row :class:`Batch` whose prefix is the token ids ``ids`` (no continuation: the item's
    query is fed by its caller); ``memo`` keeps what its conditions share across calls."""
    prefix = torch.tensor([list(ids)], dtype=torch.long)
    empty = prefix[:, :0]
    return Batch(torch.arange(1), empty, empty, {"prefix": prefix}, timing, 1, {} if memo is None else memo)
