"""Token-selective recompute (the CacheBlend rule) of an approximate stretch of a cache.

A state's rows ``[0:exact_len]`` are exact (e.g. the target's own prefill of the context) and
rows ``[exact_len:]`` approximate (a chunk prepared alone and re-positioned, or a transferred
prefix with ``exact_len = 0``). With a ratio ``r > 0``:

1. layers ``0..check_layer`` run on *every* approximate row (their inputs are the target's own
   embeddings, then the hidden states this pass computes), attending causally to the exact rows
   and to each other: those layers' K/V become the target's own for every row;
2. at ``check_layer`` the deviation of each row's fresh K/V from the approximate K/V,
   ``||dK||^2 + ||dV||^2`` over heads, picks the ``ceil(r * n)`` rows that deviate most
   (``rule="random"`` picks random rows instead, ``rule="first"`` the first rows: controls for the rule;
   ``rule="last"`` the last rows, the ones a continuation follows directly: the rule a user expects);
3. every later layer runs on the picked rows only; they attend to the exact rows, to the picked
   rows' fresh K/V and to the other rows' approximate K/V, causally by position. The other rows
   keep their approximate K/V from ``check_layer + 1`` on.

``r = 0`` returns the state untouched (the plain path, bitwise); ``r = 1`` recomputes every row
at every layer, which is a full prefill of the whole sequence (tests: logits within 1e-5).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from kvbridge.recompute.cost import Cost, layer_flops, prefill_flops
from kvbridge.recompute.runner import RowStore, embed, run_layer, run_layers, with_kv
from kvbridge.recompute.settings import RecomputeError, parse_ratio
from kvbridge.evaluate.settings import TOKEN_RULES as RULES  # the row-picking rules (named where eval checks them)


@dataclass(frozen=True)
class BlendResult:
    state: object  # KVState
    selected: torch.Tensor  # [B, k] approximate-row indices (0-based within the approximate stretch)
    deviation: torch.Tensor | None  # [B, n] per-row deviation at the check layer
    cost: Cost


def count_for(ratio: float, n: int) -> int:
    """Rows recomputed beyond the check layer for a ratio (rounded up, 0 only for r = 0)."""
    if not 0 <= ratio <= 1:
        raise RecomputeError(f"token ratio {ratio} is outside 0..1", "use e.g. 0.15 (15%)")
    return 0 if ratio == 0 else min(n, max(1, math.ceil(ratio * n - 1e-9)))


def _attended(pos_rows: torch.Tensor, positions: torch.Tensor) -> int:
    """Keys attended in all by rows at ``pos_rows [B, k]`` over a store at ``positions [B, T]``."""
    return int((positions[:, None, :] <= pos_rows[:, :, None]).sum())


def blend(
    model,
    state,
    exact_len: int,
    ratio: float,
    *,
    check_layer: int = 1,
    rule: str = "deviation",
    generator: torch.Generator | None = None,
) -> BlendResult:
    """Token-selective recompute of ``state`` rows ``[exact_len:]`` (see the module docstring)."""
    ids, positions = state.token_ids, state.positions
    b, t = ids.shape
    n = t - int(exact_len)
    layers = model.config.num_hidden_layers
    full = prefill_flops(model, t, batch=b)
    if n < 1:
        raise RecomputeError(
            f"nothing to recompute: exact_len {exact_len} covers all {t} rows",
            "give the length of the exact (context) rows only",
        )
    if rule not in RULES:
        raise RecomputeError(f"unknown token rule {rule!r}", f"use one of {', '.join(RULES)}")
    k = count_for(float(ratio), n)
    if k == 0:
        return BlendResult(
            state,
            torch.zeros(b, 0, dtype=torch.long),
            None,
            Cost(full_prefill_flops=full, note="ratio 0: the state is returned as it is"),
        )
    check_layer = min(int(check_layer), layers - 1)
    t0 = time.perf_counter()
    store = RowStore(state.keys, state.values, positions)
    rows = torch.arange(exact_len, t, device=ids.device).expand(b, n)
    hidden = embed(model, ids[:, exact_len:])
    flops, deviation = 0.0, None
    for layer in range(check_layer + 1):
        hidden = run_layer(model, layer, hidden, rows, store)
        flops += layer_flops(model, layer, b * n, _attended(positions.gather(1, rows), positions))
    if k < n:
        dk = store.keys[check_layer][:, :, exact_len:].double() - state.keys[check_layer][:, :, exact_len:].double()
        dv = store.values[check_layer][:, :, exact_len:].double() - state.values[check_layer][:, :, exact_len:].double()
        deviation = (dk.pow(2).sum((1, 3)) + dv.pow(2).sum((1, 3))).float()  # [B, n]
        if rule == "deviation":
            pick = deviation.topk(k, dim=1).indices
        elif rule == "first":
            pick = torch.arange(k).expand(b, k)
        elif rule == "last":
            pick = torch.arange(n - k, n).expand(b, k)
        else:
            g = generator or torch.Generator().manual_seed(0)
            pick = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(b)])
        pick = pick.sort(dim=1).values.to(ids.device)
        hidden = hidden.gather(1, pick[..., None].expand(b, k, hidden.shape[-1]))
        rows = rows.gather(1, pick)
    else:
        pick = torch.arange(n, device=ids.device).expand(b, n)
    for layer in range(check_layer + 1, layers):
        hidden = run_layer(model, layer, hidden, rows, store)
        flops += layer_flops(model, layer, b * k, _attended(positions.gather(1, rows), positions))
    seconds = time.perf_counter() - t0
    meta = {
        "recomputed_token_ratio": float(ratio),
        "recomputed_tokens": int(k),
        "check_layer": check_layer,
        "token_rule": rule,
    }
    out = with_kv(state, store.keys, store.values, k < n, meta)
    cost = Cost(
        flops=flops,
        seconds=seconds,
        full_prefill_flops=full,
        layers_run=tuple(range(layers)),  # every layer: 0..check_layer on all n rows, the rest on k
        rows_per_layer=(n,) * (check_layer + 1) + (k,) * (layers - check_layer - 1),
        note=f"layers 0..{check_layer} on all {n} rows, {k} rows ({rule}) beyond",
    )
    return BlendResult(out, pick, deviation, cost)


def recompute_rows(model, state, rows: torch.Tensor, *, meta: dict | None = None) -> tuple[object, Cost]:
    """``state`` with the rows at indices ``rows`` (``[k]`` or ``[B, k]``, increasing) computed by ``model``
    at **every** layer from its own embeddings; they attend causally by position to each other's fresh
    K/V and to the other rows' K/V as ``state`` holds them (the tail of ``kvbridge eval --frontier``).

    The rows left out keep their K/V bitwise. Every row given: a full prefill of the state's tokens
    at its positions (so a store of placeholders with every row given is the model's own prefill of
    those tokens at those positions: the frontier's ``truncated@R``)."""
    ids, positions = state.token_ids, state.positions
    b, t = ids.shape
    rows = torch.as_tensor(rows, dtype=torch.long, device=ids.device)
    rows = rows.expand(b, -1) if rows.dim() == 1 else rows
    k = int(rows.shape[1])
    full = prefill_flops(model, t, batch=b)
    if k == 0:
        return state, Cost(full_prefill_flops=full, note="no rows: the state is returned as it is")
    if int(rows.min()) < 0 or int(rows.max()) >= t:
        raise RecomputeError(f"rows to recompute must lie in 0..{t - 1}", "pick rows inside the state")
    t0 = time.perf_counter()
    store = RowStore(state.keys, state.values, positions)
    layers = model.config.num_hidden_layers
    run_layers(model, range(layers), embed(model, ids.gather(1, rows)), rows, store)
    attended = _attended(positions.gather(1, rows), positions)
    flops = sum(layer_flops(model, layer, b * k, attended) for layer in range(layers))
    out = with_kv(state, store.keys, store.values, k < t, {"recomputed_tokens": k, **(meta or {})})
    return out, Cost(
        flops=flops,
        seconds=time.perf_counter() - t0,
        full_prefill_flops=full,
        layers_run=tuple(range(layers)),
        rows_per_layer=(k,) * layers,
        note=f"{k} of {t} rows at every layer",
    )


__all__ = ["BlendResult", "blend", "count_for", "parse_ratio", "recompute_rows"]
