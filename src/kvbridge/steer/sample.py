"""Batched sampling with fixed seeds, and the teacher-forced costs of a steering setup.

A :class:`Setup` is what one arm runs: a prefix state (or none), the live ids fed after it, and
optional hooks (``hooks(model)``: a context manager active for the live prefill and every decode
step). :func:`sample` draws ``len(seeds)`` continuations in one batch: sample ``i`` uses its own
``torch.Generator`` seeded with ``seeds[i]`` and the inverse-CDF sampler of :mod:`kvbridge.prefix.diverge`
(``Sampler.draw_rows``: one uniform per step, read over token ids), so two arms whose
distributions are identical draw identical tokens, and arms are paired sample by sample.

:func:`costs` feeds given continuations (the unsteered arm's own samples) through a reference
setup and a steered setup in the same batch layout and returns, per sample, the negative
log-likelihood under each, the KL divergence ``KL(reference || steered)`` of the next-token
distributions averaged over the continuation's positions, and the first-step KL, counting tokens
up to and including the first end-of-turn token.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch


@dataclass(frozen=True)
class Setup:
    prefix: Any  # KVState (batch 1) or None
    live_ids: tuple
    hooks: Callable[[Any], Any] | None = None

    def cache(self, model, batch: int, host=None):
        """A fresh cache holding the prefix ``batch`` times (never aliasing the state)."""
        from transformers import DynamicCache

        from kvbridge.plugins import adapter_of

        if self.prefix is None:
            return DynamicCache()
        s = self.prefix
        tile = lambda t: t.expand(batch, *t.shape[1:]).contiguous()  # noqa: E731
        lengths = None if s.rope_lengths is None else tile(s.rope_lengths)
        tiled = replace(
            s.map_tensors(tile), token_ids=tile(s.token_ids), positions=tile(s.positions), rope_lengths=lengths
        )
        return adapter_of(model, host).inject(tiled, model)

    def context(self, model):
        return self.hooks(model) if self.hooks is not None else nullcontext()


def sample(
    model,
    setup: Setup,
    seeds: Sequence[int],
    steps: int,
    sampler=None,
    *,
    stop_ids=(),
    host=None,
    return_logits: bool = False,
) -> dict:
    """``{"tokens": [[...] per seed], "first_logits": Tensor [N, V] (with return_logits)}``.

    ``sampler=None`` decodes greedily (every row the argmax). Rows that emitted a ``stop_ids``
    token keep being fed (fixed batch shape) but their later tokens are dropped from ``tokens``.
    """
    n = len(seeds)
    device = next(model.parameters()).device
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    cache = setup.cache(model, n, host)
    rows: list[list[int]] = [[] for _ in range(n)]
    done = [False] * n
    first = None
    with torch.no_grad(), setup.context(model):
        ids = torch.tensor([list(setup.live_ids)] * n, device=device)
        logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].float().cpu()
        if return_logits:
            first = logits.clone()
        for step in range(steps):
            toks = [int(i) for i in logits.argmax(-1).tolist()] if sampler is None else sampler.draw_rows(logits, gens)
            for i, t in enumerate(toks):
                if not done[i]:
                    rows[i].append(t)
                    done[i] = t in stop_ids
            if all(done) or step + 1 == steps:
                break
            nxt = torch.tensor(toks, device=device)[:, None]
            logits = model(input_ids=nxt, cache=cache, use_cache=True).logits[:, -1].float().cpu()
    return {"tokens": rows} | ({"first_logits": first} if return_logits else {})


def _forced_logprobs(model, setup: Setup, rows: list[list[int]], host=None):
    """Log-probabilities ``[N, S, V]`` (float32) of the next token at each continuation position."""
    steps = max(len(r) for r in rows)
    pad = [r + [r[-1] if r else 0] * (steps - len(r)) for r in rows]
    live = list(setup.live_ids)
    ids = torch.tensor([live + r[:-1] for r in pad], device=next(model.parameters()).device)
    cache = setup.cache(model, len(rows), host)
    with torch.no_grad(), setup.context(model):
        logits = model(input_ids=ids, cache=cache, use_cache=True).logits[:, len(live) - 1 :].float()
    return torch.log_softmax(logits, dim=-1).cpu()


def costs(model, reference: Setup, steered: Setup, rows: list[list[int]], *, chunk: int = 16, host=None) -> dict:
    """Per-sample costs of ``steered`` on continuations ``rows`` (see the module docstring)."""
    keep = [i for i, r in enumerate(rows) if r]
    out = {key: [float("nan")] * len(rows) for key in ("nll_reference", "nll_steered", "kl", "kl_first")}
    for a in range(0, len(keep), chunk):
        idx = keep[a : a + chunk]
        part = [rows[i] for i in idx]
        ref, got = (_forced_logprobs(model, setup, part, host) for setup in (reference, steered))
        for j, (i, r) in enumerate(zip(idx, part)):
            t = torch.tensor(r)
            lr, lg = ref[j, : len(r)], got[j, : len(r)]
            out["nll_reference"][i] = float(-lr.gather(1, t[:, None]).mean())
            out["nll_steered"][i] = float(-lg.gather(1, t[:, None]).mean())
            kl = (lr.exp() * (lr - lg)).sum(-1).clamp(min=0)
            out["kl"][i] = float(kl.mean())
            out["kl_first"][i] = float(kl[0])
    return out


def repetition(tokens: Sequence[int], n: int = 3) -> float:
    """Share of repeated ``n``-grams in a continuation (0 for fewer than ``n + 1`` tokens)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if len(grams) < 2:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)
