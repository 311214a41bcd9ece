"""KVState: the one canonical container for an attention cache.

Per layer K and V are ``[batch, kv_heads, tokens, head_dim]``; ``token_ids`` and
``positions`` (``[batch, tokens]``) say what the cache was computed from; ``rope_applied``
says whether keys carry RoPE (as the model's cache stores them) or are in content space.
``rope_lengths`` (``[batch, tokens]``) records, for stateful RoPE types (dynamic,
longrope), the length of the forward that produced each key, which picks its table.
Sliding-window layers keep their full history here: injection trims what the model's own
cache would keep.

This module imports torch; config-only code (``spec``, ``compat``, the CLI's start-up)
never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from kvbridge import rope
from kvbridge.errors import StateError
from kvbridge.spec import ModelSpec

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor


@dataclass(frozen=True)
class KVState:
    """A model's attention cache in canonical form."""

    keys: tuple  # per layer Tensor [B, H_kv, T, D]
    values: tuple  # per layer Tensor [B, H_kv, T, D]
    token_ids: "Tensor"  # [B, T] long
    positions: "Tensor"  # [B, T] long, the positions keys were rotated at
    spec: ModelSpec  # the model that produced (or will consume) this state
    rope_applied: bool = True  # keys carry RoPE, as a model's cache stores them
    rope_lengths: "Tensor | None" = None  # [B, T] forward length per key (stateful RoPE)
    model_fingerprint: str = ""  # config (+ weights) fingerprint of the producer
    approximate: bool = False  # True for transferred (mapped) caches: never an exact prefix cache
    meta: dict = field(default_factory=dict, compare=False)
    # recurrent / convolution state of hybrid models: ((layer, {name: Tensor | flags}), ...); it
    # summarises all ``num_tokens`` tokens, so it moves only whole (never sliced or mapped)
    states: tuple = ()
    # sparse attention (DSA): per indexed layer its indexer keys, ((layer, Tensor [B, T, D_idx]), ...);
    # per-token keys like K (sliced, re-positioned, cloned with them), never mapped across models
    indexer_keys: tuple = ()

    # -- shape -------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def batch_size(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[1])

    @property
    def dtype(self) -> "torch.dtype":
        return self.keys[0].dtype

    @property
    def device(self) -> "torch.device":
        return self.keys[0].device

    def nbytes(self) -> int:
        tensors = (*self.keys, *self.values, *(t for _, t in self.indexer_keys))
        return sum(t.numel() * t.element_size() for t in tensors)

    # -- checks ------------------------------------------------------------------------
    def validate(
        self,
        spec: ModelSpec | None = None,
        *,
        dtype: "torch.dtype | None" = None,
        check_finite: bool = True,
        what: str = "KV state",
    ) -> "KVState":
        """Raise :class:`StateError` (one line) unless this state fits ``spec`` and is finite."""
        spec = spec or self.spec
        if len(self.keys) != len(self.values):
            raise StateError(
                f"{what} has {len(self.keys)} key layers but {len(self.values)} value layers",
                "rebuild the state from one cache",
            )
        if self.num_layers != spec.num_layers:
            raise StateError(
                f"{what} has {self.num_layers} layers; model {spec.model_type!r} has {spec.num_layers}",
                "transfer through a layer mapping (kvbridge fit) or use the producing model",
            )
        B, T = self.token_ids.shape
        if tuple(self.positions.shape) != (B, T):
            raise StateError(
                f"{what} positions shape {tuple(self.positions.shape)} != token ids shape {(B, T)}",
                "give one position per cached token",
            )
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            heads = spec.kv_heads_of(i)
            for name, t, dim in (("keys", k, spec.key_dim_of(i)), ("values", v, spec.value_dim_of(i))):
                want = (B, heads, T, dim)
                if tuple(t.shape) != want:
                    raise StateError(
                        f"{what} layer {i} {name} shape {tuple(t.shape)} != {want} expected by {spec.model_type!r} "
                        f"[batch, kv_heads={heads}, tokens={T}, head_dim={dim}]",
                        "map the state to this model's geometry first (kvbridge fit / transfer)",
                    )
                if dtype is not None and t.dtype != dtype:
                    raise StateError(
                        f"{what} layer {i} {name} dtype {t.dtype} != model dtype {dtype}",
                        f"convert it with state.to(dtype={dtype}) or load the model in {t.dtype}",
                    )
        if check_finite and not all_finite((*self.keys, *self.values)):
            for i, (k, v) in enumerate(zip(self.keys, self.values)):  # name the first bad tensor
                for name, t in (("keys", k), ("values", v)):
                    if not bool(torch.isfinite(t).all()):
                        raise StateError(
                            f"{what} layer {i} {name} has {int((~torch.isfinite(t)).sum())} NaN/inf values",
                            "recompute the cache; a mapping that produced it may be broken",
                        )
        _validate_indexer(self, spec, dtype, check_finite, what)
        return self

    # -- conversions -------------------------------------------------------------------
    def map_tensors(self, fn) -> "KVState":
        return replace(
            self,
            keys=tuple(fn(k) for k in self.keys),
            values=tuple(fn(v) for v in self.values),
            indexer_keys=tuple((i, fn(t)) for i, t in self.indexer_keys),
        )

    def to(self, device: Any = None, dtype: "torch.dtype | None" = None) -> "KVState":
        """Every K/V (and indexer key) tensor on ``device`` in ``dtype`` (None: as it is; no copy where it is)."""
        return self.map_tensors(lambda t: t.to(device=device, dtype=dtype))

    def clone(self) -> "KVState":
        def copy(v):  # a recurrent state's entry: a tensor, a dict of flags, or a plain value
            return v.clone() if isinstance(v, torch.Tensor) else (dict(v) if isinstance(v, dict) else v)

        return replace(
            self.map_tensors(lambda t: t.clone()),
            token_ids=self.token_ids.clone(),
            positions=self.positions.clone(),
            rope_lengths=None if self.rope_lengths is None else self.rope_lengths.clone(),
            meta=dict(self.meta),
            states=tuple((i, {k: copy(v) for k, v in st.items()}) for i, st in self.states),
        )

    def slice_tokens(self, start: int = 0, stop: int | None = None) -> "KVState":
        """Tokens ``[start:stop]`` of every layer (views; clone to own them)."""
        sl = slice(start, stop)
        if self.states and range(self.num_tokens)[sl] != range(self.num_tokens):
            raise StateError(
                f"{self.spec.model_type!r} layers {[i for i, _ in self.states]} hold recurrent state "
                "summarising every token: it cannot be sliced",
                "recompute the prefix you want instead of slicing the state",
            )
        return replace(
            self,
            keys=tuple(k[:, :, sl] for k in self.keys),
            values=tuple(v[:, :, sl] for v in self.values),
            token_ids=self.token_ids[:, sl],
            positions=self.positions[:, sl],
            rope_lengths=None if self.rope_lengths is None else self.rope_lengths[:, sl],
            indexer_keys=tuple((i, t[:, sl]) for i, t in self.indexer_keys),
        )

    # -- RoPE --------------------------------------------------------------------------
    def _rotated_fields(self, fn, spec: ModelSpec, *positions, **kwargs) -> dict:
        """The rotated slot ("keys", or "values" for MLA: the shared RoPE key) and the indexer keys with
        ``fn`` (rope.strip / apply / reposition) applied per layer, as fields for :func:`dataclasses.replace`."""
        slot = "values" if self.spec.cache_format == "mla" else "keys"
        keys = tuple(_per_layer(fn, k, spec, i, *positions, **kwargs) for i, k in enumerate(getattr(self, slot)))
        return {slot: keys, "indexer_keys": _indexer_rope(fn, self.indexer_keys, spec, *positions, **kwargs)}

    def strip_rope(self, host=None, *, dtype: "torch.dtype | None" = None) -> "KVState":
        """Keys in content space (RoPE removed at each key's own position).

        ``dtype``: the content state's dtype (default: the cache's). :func:`kvbridge.transfer.transfer`
        passes float32 for a half-precision cache, so the stripped keys are not rounded before
        the mapping and the re-application (one rounding, at the end).
        """
        if not self.rope_applied or self.spec.positional != "rope":
            return replace(self, rope_applied=False).to(dtype=dtype)
        kw = {} if dtype is None else {"out_dtype": dtype}
        spec, host = _resolved(self.spec, host)
        rotated = self._rotated_fields(rope.strip, spec, self.positions, lengths=self.rope_lengths, host=host, **kw)
        return replace(self, **rotated, rope_applied=False).to(dtype=dtype)

    def apply_rope(
        self,
        positions: "Tensor | None" = None,
        spec: ModelSpec | None = None,
        rope_lengths: "Tensor | None" = None,
        host=None,
        *,
        dtype: "torch.dtype | None" = None,
    ) -> "KVState":
        """Keys rotated for ``spec`` (default: own) at ``positions`` (default: own).

        ``dtype``: the cache dtype of the result (default: this state's). Wider content (float32
        for a half-precision cache) is rotated in float32 by the tables as the model holds them
        and rounded once to ``dtype`` (:func:`kvbridge.rope.apply`).
        """
        spec = spec or self.spec
        positions = self.positions if positions is None else positions
        positions = positions.to(self.token_ids.device).expand(self.batch_size, -1)
        if rope_lengths is None and spec.rope is not None and spec.rope.is_stateful:
            rope_lengths = rope.forward_lengths(positions)
        if self.rope_applied:
            raise StateError("keys already carry RoPE", "call strip_rope() first or use reposition()")
        _check_indexer_target(self, spec)
        if spec.positional != "rope":
            return replace(self, positions=positions, spec=spec, rope_applied=True).to(dtype=dtype)
        spec, host = _resolved(spec, host)
        rotated = self._rotated_fields(rope.apply, spec, positions, lengths=rope_lengths, host=host, dtype=dtype)
        out = replace(self, **rotated, positions=positions, rope_applied=True, spec=spec, rope_lengths=rope_lengths)
        return out.to(dtype=dtype)

    def reposition(self, new_positions: "Tensor | int", host=None) -> "KVState":
        """Move the cached keys to new positions (an offset int or a ``[B, T]`` tensor) in one call."""
        if isinstance(new_positions, int):
            new_positions = self.positions + new_positions
        if self.spec.positional not in ("rope", "none"):
            raise StateError(
                f"cannot re-position a {self.spec.positional}-position cache of {self.spec.model_type!r}: "
                "positions are baked into the hidden states",
                "recompute the prefix at the new positions",
            )
        if self.spec.positional == "none":
            return replace(self, positions=new_positions)
        new_positions = new_positions.to(self.token_ids.device).expand(self.batch_size, -1)
        if not self.rope_applied:
            return replace(self, positions=new_positions)
        stateful = self.spec.rope is not None and self.spec.rope.is_stateful
        new_lengths = rope.forward_lengths(new_positions) if stateful else None
        spec, host = _resolved(self.spec, host)
        rotated = self._rotated_fields(
            rope.reposition,
            spec,
            self.positions,
            new_positions,
            old_lengths=self.rope_lengths,
            new_lengths=new_lengths,
            host=host,
        )
        return replace(self, **rotated, positions=new_positions, rope_lengths=new_lengths)


def _resolved(spec: ModelSpec, host) -> tuple:
    """``(spec, host)``: a spec built through the host carries its RoPE variants and needs no host; one
    built without (from a stored manifest, by hand) is resolved here once per call, by ``host`` or the
    process-wide one, which the codec then names known types from for an unknown one."""
    tables = [spec.rope, *(t for _, t in spec.rope_by_layer_type)]
    if all(t is None or t.variant is not None for t in tables):
        return spec, host
    from kvbridge.plugins import host_or_default

    host = host_or_default(host)
    return host.resolved(spec), host


def _per_layer(fn, k: "Tensor", spec: ModelSpec, layer: int, *positions, **kwargs) -> "Tensor":
    """``fn`` (rope.strip / apply / reposition) on one layer's keys, as that layer rotates them.

    NoPE layers and layers without their own KV pass unchanged; a table whose ``direction``
    parameter is -1 rotates the other way (the rotation at ``-position``).
    """
    table = spec.rope_for_layer(layer)
    if table is None or k.shape[-1] == 0 or k.shape[1] == 0:
        return k
    return _rotate(fn, k, table, *positions, **kwargs)


def _rotate(fn, k: "Tensor", table, *positions, **kwargs) -> "Tensor":
    if table.param("direction", 1) == -1:  # keys rotated by -angle (NanoChat): the table at -position
        positions = tuple(-p for p in positions)
    return fn(k, *positions, table, **kwargs)


_FINITE_BATCH = 1 << 22  # elements per joint check: 16 MiB of float32 scratch at most


def all_finite(tensors) -> bool:
    """Whether every element of ``tensors`` is finite.

    First one ``torch._foreach_norm`` per device and dtype: a NaN or inf element makes its
    tensor's 2-norm NaN or inf, so finite norms prove every element finite, with one call over
    the list and no scratch mask. Only when a norm is not finite (a NaN/inf element, or a finite
    tensor whose norm overflows) does the exact elementwise check (:func:`_exact_all_finite`) decide.
    """
    groups: dict = {}
    for t in tensors:
        if t.is_floating_point() and t.numel():
            groups.setdefault((t.device, t.dtype), []).append(t)
    return all(_norms_finite(group) or _exact_all_finite(group) for group in groups.values())


def _norms_finite(group: list) -> bool:
    try:
        norms = torch._foreach_norm(group)
    except (AttributeError, NotImplementedError, RuntimeError, TypeError):  # no such kernel here: the exact check
        return False
    return bool(torch.isfinite(torch.stack(norms)).all())


def _exact_all_finite(tensors) -> bool:
    """Every element finite, by ``isfinite``: small tensors jointly (one call over their
    concatenation, in batches), large ones alone; ``tensors`` are :func:`all_finite`'s group of
    one device and dtype, floating point and not empty."""

    def finite(group: list) -> bool:
        return bool(torch.isfinite(torch.cat(group) if len(group) > 1 else group[0]).all())

    batch, size = [], 0
    for t in tensors:
        if t.numel() >= _FINITE_BATCH:
            if not finite([t]):
                return False
            continue
        batch.append(t.reshape(-1))
        size += t.numel()
        if size >= _FINITE_BATCH:
            if not finite(batch):
                return False
            batch, size = [], 0
    return not batch or finite(batch)


def _indexer_rope(fn, indexer_keys: tuple, spec: ModelSpec, *positions, **kwargs) -> tuple:
    """``fn`` on the RoPE part of each layer's indexer keys ``[B, T, D]`` (see
    :meth:`ModelSpec.indexer_rope_for_layer`); the rest of each key passes unchanged."""
    out = []
    for layer, t in indexer_keys:
        table, start, dims = spec.indexer_rope_for_layer(layer)
        if table is not None and t.shape[1]:
            part = _rotate(fn, t[..., start : start + dims].unsqueeze(1), table, *positions, **kwargs).squeeze(1)
            # torch.cat promotes to the wider dtype: float32 content of a half cache stays float32
            t = torch.cat([t[..., :start], part, t[..., start + dims :]], dim=-1)
        out.append((layer, t))
    return tuple(out)


def _check_indexer_target(state: "KVState", spec: ModelSpec) -> None:
    """Indexer keys go only to the model geometry that produced them (they are never mapped)."""
    if not state.indexer_keys:
        return
    if tuple(i for i, _ in state.indexer_keys) != tuple(spec.indexer_layers) or spec.indexer != state.spec.indexer:
        raise StateError(
            f"the state carries sparse-attention indexer keys of {state.spec.model_type!r} "
            f"(layers {[i for i, _ in state.indexer_keys]}) that {spec.model_type!r} does not cache "
            "that way: indexer keys cannot be mapped across models",
            "drop them (replace(state, indexer_keys=())) or extract the state from the target model",
        )


def _validate_indexer(state: "KVState", spec: ModelSpec, dtype, check_finite: bool, what: str) -> None:
    have = dict(state.indexer_keys)
    if not spec.indexer_layers and have:
        raise StateError(
            f"{what} carries indexer keys (layers {sorted(have)}) that model {spec.model_type!r} does not cache",
            "drop them: indexer keys cannot be mapped across models",
        )
    for i in spec.indexer_layers:
        t = have.get(i)
        if t is None:
            raise StateError(
                f"{what} has no sparse-attention indexer keys for layer {i} of {spec.model_type!r}",
                "extract the state from this model (indexer keys cannot be mapped across models)",
            )
        want = (*state.token_ids.shape, spec.indexer_dim())
        if tuple(t.shape) != want:
            raise StateError(
                f"{what} layer {i} indexer keys shape {tuple(t.shape)} != {want} expected by "
                f"{spec.model_type!r} [batch, tokens, index_head_dim]",
                "extract the state from this model (indexer keys cannot be mapped across models)",
            )
        if dtype is not None and t.dtype != dtype:
            raise StateError(
                f"{what} layer {i} indexer keys dtype {t.dtype} != model dtype {dtype}",
                f"convert it with state.to(dtype={dtype})",
            )
        if check_finite and not bool(torch.isfinite(t).all()):
            raise StateError(f"{what} layer {i} indexer keys have NaN/inf values", "recompute the cache")
