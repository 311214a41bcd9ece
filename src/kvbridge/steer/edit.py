"""One-shot edits of a KV state: add a steering vector, scale K/V, mix with another prompt's cache.

Every edit returns a new :class:`~kvbridge.kvstate.KVState` (the input is never modified; only
the edited layers are copied) marked ``approximate=True``, with what was done appended to
``meta["steered"]``: a steered cache is never presented as a model's own prefix state. Edits act
on the layers ``layers`` and the cache positions ``start:stop``.

Arithmetic (float32 for every cache dtype, one rounding back to the cache dtype):

- ``add_vector``: ``k + ck * R(p) d_k`` and ``v + cv * d_v``, the key direction rotated to each
  edited position ``p`` (content-space vectors; see :mod:`kvbridge.steer.vectors`). The product
  ``c * delta`` is rounded once and then added (two separate IEEE operations, never a fused
  multiply-add), so adding with ``-c`` after ``+c`` subtracts exactly the tensor that was added:
  the restored element differs from the original by at most ``eps * (|x| + |c * delta|)``
  elementwise (two correctly rounded float32 operations, ``eps = 2**-23``), on every CPU. A zero
  coefficient adds exact zeros: the tensors come back equal (bitwise, up to the sign of zero).
- ``scale_kv``: ``ck * k``, ``cv * v`` (1.0 leaves them bitwise).
- ``mix_kv``: ``(1 - alpha) * own + alpha * other`` over the range, ``other`` re-positioned to the
  edited positions first when it was computed elsewhere (0 keeps the own cache, 1 replaces it).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from kvbridge.errors import KVBridgeError


class EditError(KVBridgeError):
    """An edit's arguments are out of range (layer, position, coefficient)."""


def coefficient(value, name: str) -> float:
    """``value`` as a finite float, else a one-line error naming it (NaN / inf refused)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise EditError(f"{name} must be a number, got {value!r}", f"pass a finite number for {name}") from None
    if not math.isfinite(v):
        raise EditError(f"{name} must be finite, got {value!r}", f"pass a finite number for {name}")
    return v


def layers_of(layers, num_layers: int) -> tuple:
    """Layer indices from ``"all"``, ``"0,2"``, ``"1-3"``, a sequence or None (= all); out of range refused."""
    from kvbridge.prefix.ablate import parse_layers

    if layers is None:
        return tuple(range(num_layers))
    try:
        return parse_layers(layers, num_layers)
    except KVBridgeError as exc:
        raise EditError(exc.what, exc.fix) from None


def positions_of(state, start: int, stop: int | None) -> tuple[int, int]:
    n = state.num_tokens
    stop = n if stop is None else stop
    if not (0 <= start < stop <= n):
        raise EditError(
            f"edit positions {start}:{stop} are outside the cache's {n} tokens", "edit positions that the cache holds"
        )
    return start, stop


def _edited(state, layers, start: int, stop: int, on_keys, on_values, record: dict):
    """``state`` with ``on_keys(i, x)`` / ``on_values(i, x)`` replacing the keys / values ``x`` (float32) of
    each of ``layers`` at positions ``start:stop`` (rounded once to the cache dtype), marked steered
    (``approximate``, ``record`` appended to ``meta["steered"]``)."""
    import torch

    keys, values = list(state.keys), list(state.values)
    for i in layers:
        for group, fn in ((keys, on_keys), (values, on_values)):
            t = group[i].clone()
            t[:, :, start:stop] = fn(i, t[:, :, start:stop].to(torch.float32)).to(t.dtype)
            group[i] = t
    steered = list(state.meta.get("steered", ())) + [record]
    return replace(
        state, keys=tuple(keys), values=tuple(values), approximate=True, meta={**state.meta, "steered": steered}
    )


def _check_vector(state, vector) -> None:
    if vector.num_layers != state.num_layers:
        raise EditError(
            f"the steering vector has {vector.num_layers} layers, the cache {state.num_layers}",
            "use a vector built on this model",
        )
    for i, (k, d) in enumerate(zip(state.keys, vector.keys)):
        if (k.shape[1], k.shape[-1]) != tuple(d.shape):
            raise EditError(
                f"layer {i}: vector keys {tuple(d.shape)} vs cache [kv_heads, head_dim] {(k.shape[1], k.shape[-1])}",
                "use a vector built on this model",
            )


def key_deltas(state, vector, start: int, stop: int, layers: Sequence[int]) -> dict:
    """Per layer the key direction at each edited position ``[B, H, n, D]`` float32 (rotated there
    for content-space vectors, as is for rotated-space ones)."""
    import torch

    from kvbridge.kvstate import KVState

    B, n = state.batch_size, stop - start
    device = state.device
    keys = tuple(vector.keys[i].to(device)[None, :, None, :].expand(B, -1, n, -1) for i in range(state.num_layers))
    if vector.key_space != "content" or not state.rope_applied or state.spec.positional != "rope":
        return {i: keys[i] for i in layers}
    lengths = None if state.rope_lengths is None else state.rope_lengths[:, start:stop]
    d = KVState(
        keys=keys,
        values=keys,
        token_ids=state.token_ids[:, start:stop],
        positions=state.positions[:, start:stop],
        spec=state.spec,
        rope_applied=False,
    )
    rotated = d.apply_rope(rope_lengths=lengths, dtype=torch.float32)
    return {i: rotated.keys[i] for i in layers}


def add_vector(
    state, vector, *, ck: float = 0.0, cv: float = 0.0, layers=None, start: int = 0, stop: int | None = None
):
    """``state`` with ``ck`` x the key direction and ``cv`` x the value direction added at
    ``layers`` and positions ``start:stop`` (see the module docstring)."""
    import torch

    ck, cv = coefficient(ck, "--ck"), coefficient(cv, "--cv")
    chosen = layers_of(layers, state.num_layers)
    start, stop = positions_of(state, start, stop)
    _check_vector(state, vector)
    kd = key_deltas(state, vector, start, stop, chosen)
    dv = {i: vector.values[i].to(state.device)[None, :, None, :] for i in chosen}
    record = {"edit": "add_vector", "ck": ck, "cv": cv, "layers": list(chosen), "positions": [start, stop]}
    # c * delta rounded once, then added: never fused
    on_keys = lambda i, x: x + ck * kd[i].to(torch.float32)  # noqa: E731
    on_values = lambda i, x: x + cv * dv[i].to(torch.float32)  # noqa: E731
    return _edited(state, chosen, start, stop, on_keys, on_values, {**record, "key_space": vector.key_space})


def scale_kv(state, *, ck: float = 1.0, cv: float = 1.0, layers=None, start: int = 0, stop: int | None = None):
    """``state`` with keys x ``ck`` and values x ``cv`` at ``layers``, positions ``start:stop``."""
    ck, cv = coefficient(ck, "--ck"), coefficient(cv, "--cv")
    chosen = layers_of(layers, state.num_layers)
    start, stop = positions_of(state, start, stop)
    record = {"edit": "scale_kv", "ck": ck, "cv": cv, "layers": list(chosen), "positions": [start, stop]}
    return _edited(state, chosen, start, stop, lambda i, x: x * ck, lambda i, x: x * cv, record)


def mix_kv(state, other, *, alpha: float = 1.0, layers=None, start: int = 0, stop: int | None = None):
    """``(1 - alpha) * state + alpha * other`` at ``layers``, positions ``start:stop`` (``other``'s
    tokens ``start:stop``, re-positioned to ``state``'s positions when they differ)."""
    import torch

    alpha = coefficient(alpha, "alpha")
    chosen = layers_of(layers, state.num_layers)
    start, stop = positions_of(state, start, stop)
    if other.num_tokens < stop:
        raise EditError(
            f"the other cache has {other.num_tokens} tokens, the edit needs positions {start}:{stop}",
            "mix with a prompt at least as long as the edited range",
        )
    if other.num_layers != state.num_layers or any(
        a.shape[1:2] + a.shape[3:] != b.shape[1:2] + b.shape[3:] for a, b in zip(state.keys, other.keys)
    ):
        raise EditError("the other cache has another geometry", "mix caches of the same model")
    batch = state.batch_size
    part = other.slice_tokens(start, stop)
    if other.batch_size != batch:
        if other.batch_size != 1:
            raise EditError(
                f"the other cache has batch {other.batch_size}, the edited one {batch}", "mix with one prompt"
            )
        part = part.map_tensors(lambda t: t.expand(batch, *t.shape[1:]))
        part = replace(part, token_ids=part.token_ids.expand(batch, -1), positions=part.positions.expand(batch, -1))
    want = state.positions[:, start:stop]
    if not torch.equal(part.positions.to(want.device), want):
        part = part.reposition(want)

    def mixed(srcs):
        return lambda i, x: (1.0 - alpha) * x + alpha * srcs[i].to(device=x.device, dtype=torch.float32)

    record = {"edit": "mix_kv", "alpha": alpha, "layers": list(chosen), "positions": [start, stop]}
    return _edited(state, chosen, start, stop, mixed(part.keys), mixed(part.values), record)
