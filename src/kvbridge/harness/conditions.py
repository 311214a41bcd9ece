"""The harness conditions: who prefills a task's context, and which model answers from that cache.

- ``target``: the target prefills the context and answers (its own ceiling);
- ``source``: the source prefills the context and answers itself (no transfer);
- ``transferred``: the source prefills the context, the mapping moves the cache
  (:func:`kvbridge.transfer.transfer`: strip the source RoPE, map, apply the target RoPE), the
  target answers;
- ``plain``: the source's cache given to the target as it is (the identity mapping; only where
  layers, KV heads and head dim agree), what a serving stack sharing caches would do;
- ``no_context``: the target answers the query alone (where a task says that is meaningful);
- recompute points on the transferred cache (:class:`Recompute`): ``transferred+layers:SPEC``
  (those target layers recomputed with the target's own forward over the context:
  :func:`kvbridge.recompute.layers.recompute_layers`) and ``transferred+tokens:R`` (a share of
  the context tokens recomputed by the CacheBlend rule: :func:`kvbridge.recompute.tokens.blend`);
- the compute frontier's points (``--frontier R``, :mod:`kvbridge.recompute.frontier`, its own
  cache builders): ``truncated@R``, the target's own prefill of only the first ``S`` (sink) and the
  last ``ceil(R * P)`` context tokens at their original positions (no transfer; the live ids keep
  positions ``P, P+1, ...``), and ``tail@R``, those same rows computed by the target at every layer
  over the mapped cache of every other row (``tail@0`` is ``transferred``; ``truncated@1`` and
  ``tail@1`` are the target's own prefill).

Every condition sees the same token ids: the context ids (tokenised with the tokenizer's special
tokens) are what the cache holds; the live ids (query, then a choice for log-likelihood scoring)
are fed by the answering model from that cache. Where the query is empty the last context token
is withheld from the cache and fed live (as :mod:`kvbridge.handoff` does for ``generate``).

:class:`Answerer` holds the models, the mapping and a small memo of prefix caches per context,
so one source prefill serves ``source``, ``transferred``, ``plain`` and the recompute points,
and the choices of one item share one cache per condition.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

from kvbridge.harness.protocol import HarnessError

#: the base conditions, in report order
CONDITIONS = ("target", "source", "transferred", "plain", "no_context")
#: the frontier's point kinds, in report order (:func:`kvbridge.recompute.frontier.point_name`)
FRONTIER_KINDS = ("truncated", "tail")


def frontier_points(ratios) -> dict:
    """``{"truncated@R": ("truncated", R), "tail@R": ("tail", R), ...}`` in report order."""
    from kvbridge.recompute.frontier import point_name

    return {
        point_name(kind, r): (kind, float(r)) for r in sorted({float(x) for x in ratios}) for kind in FRONTIER_KINDS
    }


@dataclass(frozen=True)
class Recompute:
    """A recompute point on the transferred cache: ``layers`` (target layer indices) or ``ratio``
    (share of the context tokens). ``spec`` is what the user wrote."""

    kind: str  # "layers" | "tokens"
    spec: str
    layers: tuple = ()
    ratio: float = 0.0

    @property
    def name(self) -> str:
        return f"transferred+{self.kind}:{self.spec}"


def parse_recompute_layers(text: str | None, num_layers: int) -> list[Recompute]:
    """``--recompute-layers``: ``;``-separated points, each ``3,7-9``, ``all`` or ``N%`` (the first
    floor(N% x layers) target layers: in target mode any set costs its last layer's depth, so the
    first K layers are the cheapest K; no calibration pass)."""
    from kvbridge.recompute.layers import budget_count, parse_layers

    out = []
    for part in [p.strip() for p in (text or "").split(";") if p.strip()]:
        m = re.fullmatch(r"(\d+(?:\.\d+)?)%", part)
        if m:
            share = float(m.group(1)) / 100
            if not 0 < share <= 1:
                raise HarnessError(f"--recompute-layers {part!r} is outside (0, 100%]", "use e.g. 10% or 20%")
            layers = tuple(range(max(1, budget_count(share, num_layers))))
        else:
            layers = parse_layers(part, num_layers)
            if not layers or layers[0] == "auto":
                raise HarnessError(
                    f"--recompute-layers {part!r} names no layers",
                    "use a layer list (3,7-9), all, or a share of the first layers (10%)",
                )
        out.append(Recompute("layers", part, layers=tuple(layers)))
    return out


def parse_recompute_tokens(text: str | None) -> list[Recompute]:
    """``--recompute-tokens``: comma-separated shares of the context tokens, e.g. ``15%,30%``."""
    from kvbridge.recompute.tokens import parse_ratio

    out = []
    for part in [p.strip() for p in (text or "").split(",") if p.strip()]:
        r = parse_ratio(part)
        if not 0 < r <= 1:
            raise HarnessError(f"--recompute-tokens {part!r} is outside (0, 100%]", "use e.g. 15%")
        out.append(Recompute("tokens", part, ratio=r))
    return out


class Answerer:
    """Answers log-likelihood and generation requests under any condition (see the module docstring).

    ``tokenizer`` is the pair's shared tokenizer (``eos`` ids stop generation).
    """

    MEMO = 4  # contexts whose caches are kept

    def __init__(self, source, target, mapping, tokenizer, *, recompute=(), frontier=(), sink=None, host=None):
        from kvbridge.evaluate.runner import Prefills
        from kvbridge.plugins import get_host
        from kvbridge.recompute.frontier import DEFAULT_SINK
        from kvbridge.transfer import content_geometry as geometry

        self.host = host or get_host()
        self.source, self.target, self.mapping, self.tokenizer = source, target, mapping, tokenizer
        fix = "pass the mapping fitted for this pair (kvbridge fit SRC TGT)"
        self.prefills = p = Prefills(source, target, mapping, host=self.host, error=HarnessError, fix=fix)
        self.sad, self.tad, self.sspec, self.tspec = p.sad, p.tad, p.sspec, p.tspec
        self.plain_ok = geometry(self.sspec) == geometry(self.tspec)
        self.recompute = {r.name: r for r in recompute}
        self.frontier = frontier_points(frontier)  # shares and sink checked by HarnessSettings
        self.sink = DEFAULT_SINK if sink is None else int(sink)
        cfg = getattr(target, "generation_config", None)
        eos = (getattr(tokenizer, "eos_token_id", None), getattr(cfg, "eos_token_id", None))
        eos_lists = [[e] if isinstance(e, int) else e if isinstance(e, (list, tuple)) else () for e in eos]
        self.eos_ids = {int(e) for ids in eos_lists for e in ids}
        self._memo: OrderedDict = OrderedDict()
        keys = ("source_prefill_s", "target_prefill_s", "transfer_s", "recompute_s", "frontier_s")
        self.timing = dict.fromkeys(keys, 0.0)  # seconds per shared prefill and per point kind
        #: one model on both sides (an identity pair): the target's prefill IS the source's
        self.one_model = target is source and self.tspec == self.sspec
        #: work not repeated: target prefills served by the source's, answers served by an earlier
        #: condition's (same model, bitwise the same cache, the same request)
        self.reused = {"prefills": 0, "answers": 0}
        self.built_by = self._build_set()

    # -- which conditions apply ------------------------------------------------------------------
    def conditions(self, wanted=None) -> list[str]:
        """The condition names to run (``wanted``: names, default all that apply), in report order."""
        names = list(CONDITIONS) + list(self.recompute) + list(self.frontier)
        if wanted is None:
            return [c for c in names if c != "plain" or self.plain_ok]
        wanted = list(wanted)
        for c in wanted:
            if c not in names:
                raise HarnessError(f"unknown condition {c!r}", f"use some of {', '.join(names)}")
            if c == "plain" and not self.plain_ok:
                from kvbridge.transfer import content_geometry as geometry

                raise HarnessError(
                    "the plain-reuse condition needs the same (layers, kv_heads, head_dim) on both "
                    f"models; source {geometry(self.sspec)}, target {geometry(self.tspec)}",
                    "leave plain out of --conditions",
                )
        return [c for c in names if c in wanted]

    # -- prefix caches --------------------------------------------------------------------------
    def _states(self, ctx: tuple) -> dict:
        memo = self._memo.setdefault(ctx, {})
        self._memo.move_to_end(ctx)
        while len(self._memo) > self.MEMO:
            self._memo.popitem(last=False)
        return memo

    def _build_set(self) -> dict:
        """The harness's condition set (:class:`kvbridge.evaluate.runner.Condition` s by name) over the
        shared prefills of :class:`kvbridge.evaluate.runner.Prefills` on a one-context batch."""
        from functools import partial

        from kvbridge.evaluate.runner import Built, Condition

        p = self.prefills

        def target(bt):
            if not self.one_model:
                return Built(p.native(bt))
            if "native" not in bt.memo:  # the same forward on the same ids: the same cache
                self.reused["prefills"] += 1
            return Built(bt.once("native", lambda: p.source_state(bt)))

        builds = {"target": target}
        builds.update({name: partial(self._frontier, name) for name in self.frontier})
        builds.update({name: partial(self._recompute, point) for name, point in self.recompute.items()})
        shared = {c.name: c for c in [*p.conditions("source", "transferred"), plain_condition(p)]}  # as eval's
        return {**shared, **{name: Condition(name, build) for name, build in builds.items()}}

    def _frontier(self, name: str, bt):
        """``truncated@R`` / ``tail@R``: the frontier's own builders (:mod:`kvbridge.recompute.frontier`)."""
        from kvbridge.evaluate.runner import Built
        from kvbridge.recompute.frontier import kept_rows, truncated_state
        from kvbridge.recompute.tokens import recompute_rows

        kind, r = self.frontier[name]
        moved = self.prefills.transferred(bt)
        rows = kept_rows(bt.parts["prefix"].shape[1], r, self.sink, tail=kind == "tail")
        if kind == "tail":
            make = lambda: recompute_rows(self.target, moved, rows, meta={"frontier": name})[0]  # noqa: E731
        else:  # the layout (tokens, positions) of either target-side state; its K/V are not read
            make = lambda: truncated_state(self.target, bt.memo.get("native", moved), rows)[0]  # noqa: E731
        return Built(bt.once(name, make, "frontier_s"))

    def _recompute(self, point, bt):
        """A recompute point on the transferred cache (layers, or a share of the tokens)."""
        from kvbridge.evaluate.runner import Built
        from kvbridge.recompute.layers import recompute_layers
        from kvbridge.recompute.tokens import blend

        moved = self.prefills.transferred(bt)
        if point.kind == "layers":
            make = lambda: recompute_layers(self.target, moved, point.layers, mode="target")[0]  # noqa: E731
        else:
            make = lambda: blend(self.target, moved, 0, point.ratio).state  # noqa: E731
        return Built(bt.once(point.name, make, "recompute_s"))

    def prefix(self, cond: str, ctx: tuple):
        """``(model, adapter, state or None)`` for a condition and cached context ids."""
        from kvbridge.evaluate.runner import context_batch

        if cond == "no_context" or not ctx:
            return (self.source, self.sad, None) if cond == "source" else (self.target, self.tad, None)
        condition = self.built_by.get(cond)
        if condition is None:
            raise HarnessError(f"unknown condition {cond!r}", f"use some of {', '.join(self.conditions())}")
        built = condition.build(context_batch(ctx, self.timing, self._states(ctx)))
        return (*self.prefills.models[built.on], built.state)

    @staticmethod
    def ids_for(cond: str, ctx: list, live: list) -> tuple[tuple, list]:
        """``(cached ids, live ids)`` of a request: with no live ids the last context token is fed live;
        no_context feeds ``ctx + live`` with no cache (the caller passes only what that condition keeps
        of the context, e.g. the BOS token)."""
        ctx, live = list(ctx), list(live)
        if cond == "no_context":
            if not ctx + live:
                raise HarnessError("a no-context request with nothing to feed", "give the item a query")
            return (), ctx + live
        if not live:
            if not ctx:
                raise HarnessError("an item with neither context nor query", "give the task's items some text")
            return tuple(ctx[:-1]), ctx[-1:]
        return tuple(ctx), live

    def _forward(self, model, adapter, state, live):
        import torch
        from transformers import DynamicCache

        start = next_position(state)
        gap = start is not None
        cache = adapter.inject(state, model, check=not gap) if state is not None else DynamicCache()
        kwargs = {"position_ids": torch.arange(start, start + len(live))[None]} if gap else {}
        with torch.no_grad():
            logits = model(
                input_ids=torch.tensor([live], dtype=torch.long), cache=cache, use_cache=True, **kwargs
            ).logits
        return logits[0].float(), cache

    # -- requests -----------------------------------------------------------------------------------
    def loglikelihood(self, cond: str, ctx: list, live: list, continuation: list) -> tuple[float, bool]:
        """``(sum log p(continuation | ctx + live), greedy)`` under ``cond``; ``greedy``: every
        continuation token is the argmax."""
        import torch

        if not continuation:
            raise HarnessError("an empty continuation cannot be scored", "give every choice at least one token")
        cached, live_ids = self.ids_for(cond, ctx, live)
        model, adapter, state = self.prefix(cond, cached)
        feed = live_ids + list(continuation)

        def score():
            logits, _ = self._forward(model, adapter, state, feed)
            n = len(continuation)
            logp = torch.log_softmax(logits[-n - 1 : -1].double(), dim=-1)
            tgt = torch.tensor(continuation, dtype=torch.long)
            return float(logp.gather(-1, tgt[:, None]).sum()), bool((logp.argmax(-1) == tgt).all())

        return self._answer(cached, ("loglikelihood", id(model), id(adapter), tuple(feed)), state, score)

    def _answer(self, cached: tuple, request: tuple, state, compute):
        """``compute()``, or the answer an earlier condition got for the same ``request`` (model,
        adapter, live ids, options) from a cache bitwise equal to ``state``: the same forwards on the
        same numbers, so the same answer (an identity pair's target, source, transferred and plain
        conditions hold one cache)."""
        seen = self._states(cached).setdefault(("answers",) + request, [])
        for other, answer in seen:
            if same_cache(other, state):
                self.reused["answers"] += 1
                return answer
        answer = compute()
        seen.append((state, answer))
        return answer

    def generate(self, cond: str, ctx: list, live: list, *, max_new_tokens: int, stop=()) -> str:
        """The greedy completion of ``ctx + live`` under ``cond``, cut at the first ``stop`` string or EOS."""
        cached, live_ids = self.ids_for(cond, ctx, live)
        model, adapter, state = self.prefix(cond, cached)
        request = ("generate", id(model), id(adapter), tuple(live_ids), int(max_new_tokens), tuple(stop or ()))
        return self._answer(
            cached, request, state, lambda: self._greedy(model, adapter, state, live_ids, max_new_tokens, stop)
        )

    def _greedy(self, model, adapter, state, live_ids, max_new_tokens: int, stop) -> str:
        import torch

        logits, cache = self._forward(model, adapter, state, live_ids)
        start = next_position(state)  # a truncated cache: the live ids keep their original positions
        pos = None if start is None else start + len(live_ids)
        nxt = int(logits[-1].argmax())
        toks: list[int] = []
        text = ""
        for step in range(int(max_new_tokens)):
            if nxt in self.eos_ids:
                break
            toks.append(nxt)
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            if any(s and s in text for s in stop) or step == max_new_tokens - 1:
                break
            kwargs = {} if pos is None else {"position_ids": torch.tensor([[pos + step]])}
            with torch.no_grad():
                out = model(input_ids=torch.tensor([[nxt]], dtype=torch.long), cache=cache, use_cache=True, **kwargs)
            nxt = int(out.logits[0, -1].float().argmax())
        return cut_at_stop(text, stop)


def plain_condition(pre):
    """``plain``: the source's prefix cache given to the target as it is (the identity mapping), made once
    per batch from the shared :class:`~kvbridge.evaluate.runner.Prefills` ``pre`` (the adapter pair's too)."""
    from kvbridge.evaluate.runner import Built, Condition
    from kvbridge.transfer import IdentityMapping, transfer

    make = lambda bt: transfer(pre.source_state(bt), IdentityMapping(), pre.tspec, host=pre.host)  # noqa: E731
    return Condition("plain", lambda bt: Built(bt.once("plain", lambda: make(bt))))


def next_position(state) -> int | None:
    """The position of the first live id after ``state`` where it is not the state's length (a
    truncated cache keeps its rows' original positions: the next one is the last + 1); else None."""
    if state is None or state.positions is None or not state.num_tokens:
        return None
    nxt = int(state.positions.reshape(-1, state.positions.shape[-1])[0, -1]) + 1
    return None if nxt == state.num_tokens else nxt


def same_cache(a, b) -> bool:
    """Whether two states (or ``None``: no cache) hold bitwise the same cache for the same model."""
    import torch

    if a is b:
        return True
    if a is None or b is None:
        return False
    head = [(s.spec, s.rope_applied, s.num_layers, s.dtype, s.rope_lengths is None) for s in (a, b)]
    # recurrent states and indexer keys: not compared
    if head[0] != head[1] or a.states or b.states or a.indexer_keys or b.indexer_keys:
        return False
    pairs = [(a.token_ids, b.token_ids), (a.positions, b.positions), *zip(a.keys, b.keys), *zip(a.values, b.values)]
    if a.rope_lengths is not None:
        pairs.append((a.rope_lengths, b.rope_lengths))
    return all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y) for x, y in pairs)


def cut_at_stop(text: str, stop) -> str:
    """``text`` up to the first occurrence of any stop string."""
    found = [i for i in (text.find(s) for s in stop or () if s) if i >= 0]
    return text[: min(found, default=len(text))]
