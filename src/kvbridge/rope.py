"""The exact RoPE codec: remove rotary position embeddings from cached keys and re-apply them.

A model's cache stores keys *after* RoPE. :func:`strip` undoes the rotation (keys in content
space), :func:`apply` rotates content-space keys at any positions, :func:`reposition` does
both in one call. Every function works on ``[batch, heads, tokens, head_dim]`` keys and
``[batch, tokens]`` positions and reproduces the transformers 5.x arithmetic: the inverse
frequencies are computed on the CPU in float32 with the same operations as
``transformers.modeling_rope_utils`` (so the tables are bit-identical at any position, where
one ulp of ``inv_freq`` would cost 1e-3 rad at position 40k), the angles are
``position.float() * inv_freq``, the tables are multiplied by the attention scaling and cast
to the keys' dtype before the rotation, as the models do.

Conventions (``RopeSpec.interleaved``):

- half split (Llama, Mistral, Qwen, Gemma, Phi, NeoX, Falcon ...): dim ``i`` pairs with
  ``i + rotary_dim/2``; tables are the frequencies concatenated twice;
- interleaved (GPT-J, CodeGen, Cohere): dims ``2i`` and ``2i+1`` pair; tables repeat each
  frequency twice, adjacently.

Only the first ``rope.rotary_dim`` dims rotate (partial rotary); the rest pass unchanged.

Stateful types (``dynamic``, ``longrope``) pick their table from the length of the forward
that produced each key: pass ``lengths`` (``[batch, tokens]``, e.g. ``KVState.rope_lengths``);
``None`` means one prefill of the given positions (:func:`forward_lengths`). Keys with
different lengths are grouped by distinct table.

RoPE types are :class:`~kvbridge.plugin_types.RopeVariant` objects, looked up through the
plugin host (``host``, default the process-wide one): the built-in types are registered by
:mod:`kvbridge.builtin.rope_variants` like any plugin's, so this codec does not import them.

Performance: inverse frequencies are cached per ``(spec, length, device)``; the per-call
tables are cached per ``(spec, positions tensor, lengths tensor)`` by tensor identity and
version counter, so the 28 layers of one ``KVState.strip_rope()`` build the table once. No
Python loops over heads or tokens. The rotations are :mod:`kvbridge.rope_kernels`' (which
describes them): a one-pass native kernel for half-split CPU float32/bfloat16 keys where it builds
and checks out, else eager torch kernels (``$KVBRIDGE_ROPE_KERNEL=auto|native|eager``).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

import torch

from kvbridge.rope_kernels import _Kernel
from kvbridge.plugin_types import RopeError, RopeVariant, UnknownRopeTypeError
from kvbridge.spec import RopeSpec

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

__all__ = [
    "RopeVariant",
    "RopeError",
    "UnknownRopeTypeError",
    "tables",
    "apply",
    "strip",
    "reposition",
    "forward_lengths",
    "inv_freq",
    "variant_for",
    "clear_caches",
]


# -- lookup ---------------------------------------------------------------------------------------
def variant_for(rope: RopeSpec, host=None) -> RopeVariant:
    """The :class:`RopeVariant` the spec carries (resolved when the spec was built: ``Host.describe``,
    ``Host.resolved``), else ``host.get("rope_variant", rope.rope_type)``; the codec looks nothing up."""
    if rope.variant is not None:
        return rope.variant
    if host is not None:
        return host.get("rope_variant", rope.rope_type)
    raise UnknownRopeTypeError(
        f"RoPE type {rope.rope_type!r} has no variant: unknown to the host that built the spec, or a spec "
        "built without one",
        "build the spec through the plugin host (host.describe, host.resolved), or install a plugin that "
        "registers the type (kvbridge_register_rope_variants)",
    )


def _takes_device(fn: Callable) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in params)


@functools.lru_cache(maxsize=512)
def _cpu_inv_freq(variant: RopeVariant, rope: RopeSpec, seq_len: int | None) -> tuple:
    # without the device: a plugin written to the two-argument form of the hook docs
    args = (rope, seq_len, torch.device("cpu")) if _takes_device(variant.inv_freq) else (rope, seq_len)
    inv, scaling = variant.inv_freq(*args)
    inv = torch.as_tensor(inv, dtype=torch.float32).reshape(-1).cpu()
    if inv.numel() != rope.rotary_dim // 2:
        raise RopeError(
            f"RoPE variant {variant.name!r} returned {inv.numel()} inverse frequencies, "
            f"rotary_dim {rope.rotary_dim} needs {rope.rotary_dim // 2}",
            "fix the variant's inv_freq",
        )
    return inv, float(scaling)


@functools.lru_cache(maxsize=1024)
def _device_inv_freq(variant: RopeVariant, rope: RopeSpec, seq_len: int | None, device: str) -> tuple:
    inv, scaling = _cpu_inv_freq(variant, rope, seq_len)
    return inv.to(device), scaling


def inv_freq(rope: RopeSpec, seq_len: int | None = None, *, device=None, host=None) -> tuple:
    """``(inv_freq, attention_scaling)`` of ``rope`` at forward length ``seq_len`` (a copy)."""
    inv, scaling = _device_inv_freq(
        variant_for(rope, host), rope, None if seq_len is None else int(seq_len), str(torch.device(device or "cpu"))
    )
    return inv.clone(), scaling


def forward_lengths(positions: "Tensor") -> "Tensor":
    """The forward length one prefill of ``positions`` uses for its table.

    transformers takes ``max(position_ids) + 1`` over the whole batch of one forward, so every
    row of a batch (ragged or not) shares it.
    """
    positions = torch.as_tensor(positions)
    return (positions.max() + 1).expand(positions.shape).clone()


# -- per-call tables, cached by tensor identity ---------------------------------------------------
class _Tables:
    """Half tables of one (spec, positions, lengths): float32 ``[Bp, 1, T, rotary_dim/2]``."""

    __slots__ = ("cos", "sin", "memo", "__weakref__")

    def __init__(self, cos: "Tensor", sin: "Tensor"):
        self.cos, self.sin = cos, sin
        self.memo: dict = {}

    def rounded(self, dtype) -> tuple:
        """cos/sin as the model uses them: rounded to ``dtype`` (then held in that dtype)."""
        key = ("rounded", dtype)
        if key not in self.memo:
            self.memo[key] = (self.cos.to(dtype), self.sin.to(dtype))
        return self.memo[key]

    def kernel(self, dtype, inverse: bool, work=None) -> "_Kernel":
        """The rotation that applies (or, ``inverse``, undoes) these tables on ``dtype`` data.

        ``work`` (apply only): compute in this wider dtype with the tables rounded to ``dtype``,
        as the model holds them (content-space keys kept in float32 for a half-precision cache).
        """
        key = ("kernel", dtype, inverse, work)
        if key not in self.memo:
            if not inverse:
                work = work or dtype
                cos, sin = self.rounded(dtype)
                self.memo[key] = _Kernel(cos.to(work), sin.to(work), work)  # no copy when work is dtype
            else:
                # undo the rotation the model did with tables rounded to its dtype: rotate by
                # -angle and divide by cos^2 + sin^2 (= attention_scaling^2), in float32 at least
                work = torch.float64 if dtype == torch.float64 else torch.float32
                cos, sin = (t.to(torch.float64) for t in self.rounded(dtype))
                norm = cos * cos + sin * sin
                self.memo[key] = _Kernel((cos / norm).to(work), (-sin / norm).to(work), work)
        return self.memo[key]


class _IdentityCache:
    """A small LRU keyed by object identity + tensor version counter, checked through weak refs.

    A tensor key is ``(id, version, data_ptr, stride, shape, dtype, device)``; the weak ref
    guards against a freed tensor's id being reused, and its callback drops the entry once a key
    object dies (a finished batch's tables are not held until 32 newer ones push them out).
    Inference tensors (no version counter) are keyed by content instead.
    """

    def __init__(self, size: int = 32):
        self.size = size
        self.items: OrderedDict = OrderedDict()

    @staticmethod
    def part(obj) -> tuple:
        """``(key part, keyed by identity)`` of one object of the key (identity keys are checked, and
        their entries dropped, through weak refs that :meth:`lookup` makes)."""
        if obj is None:
            return None, False
        if isinstance(obj, (list, tuple, int, float)):  # no weak reference: keyed by its value
            obj = torch.as_tensor(obj)
            return ("content", tuple(obj.shape), str(obj.dtype), "cpu", obj.numpy().tobytes()), False
        if not isinstance(obj, torch.Tensor):
            return ("id", id(obj)), True
        meta = (tuple(obj.shape), str(obj.dtype), str(obj.device))
        try:
            version = obj._version
        except Exception:  # inference tensor: no version counter, key by content
            data = obj.detach().cpu().to(torch.float64 if obj.is_floating_point() else torch.int64)
            return ("content", *meta, data.numpy().tobytes()), False
        return ("id", id(obj), version, obj.data_ptr(), obj.stride(), *meta), True

    def lookup(self, objs: tuple, extra: tuple, build: Callable[[], Any]) -> Any:
        parts = [self.part(o) for o in objs]
        key = (tuple(p[0] for p in parts), extra)
        hit = self.items.get(key)
        if hit is not None:
            refs, value = hit
            if all(ref is None or ref() is obj for ref, obj in zip(refs, objs)):
                self.items.move_to_end(key)
                return value
            del self.items[key]
        value = build()

        def forget(_ref, key=key, items=self.items) -> None:  # a key object died: its entry can never hit
            items.pop(key, None)

        refs = tuple(weakref.ref(o, forget) if p[1] else None for p, o in zip(parts, objs))
        self.items[key] = (refs, value)
        while len(self.items) > self.size:
            self.items.popitem(last=False)
        return value


_TABLES = _IdentityCache(32)
_FUSED = _IdentityCache(16)


def clear_caches() -> None:
    """Drop every cached frequency and table (tests; after changing a plugin's variant)."""
    _cpu_inv_freq.cache_clear()
    _device_inv_freq.cache_clear()
    _TABLES.items.clear()
    _FUSED.items.clear()


def _positions_2d(positions, device) -> "Tensor":
    positions = torch.as_tensor(positions)
    if positions.dim() == 1:
        positions = positions[None]
    if positions.dim() != 2:
        raise RopeError(
            f"positions must be [batch, tokens], got shape {tuple(positions.shape)}",
            "pass one position per cached token",
        )
    return positions.to(device)


def _build_tables(rope: RopeSpec, variant: RopeVariant, pos: "Tensor", lengths: "Tensor | None", device) -> _Tables:
    dev = str(device)
    scaling = 1.0  # the attention scaling: a number, or per key [B, T, 1] (stateful tables of several lengths)
    if not (rope.is_stateful or variant.stateful):
        inv, scaling = _device_inv_freq(variant, rope, None, dev)
        angles = pos[..., None].float() * inv
    else:
        lens = forward_lengths(pos) if lengths is None else torch.as_tensor(lengths).to(device)
        if lens.dim() == 1:
            lens = lens[None]
        try:
            pos, lens = torch.broadcast_tensors(pos, lens)
        except RuntimeError:
            raise RopeError(
                f"RoPE lengths shape {tuple(lens.shape)} does not fit positions shape {tuple(pos.shape)}",
                "give one forward length per cached token",
            ) from None
        uniq, inverse = torch.unique(lens, return_inverse=True)
        pick = variant.table_length or (lambda _rope, n: n)
        keys = [pick(rope, int(n)) for n in uniq.tolist()]
        distinct = list(dict.fromkeys(keys))
        found = [_device_inv_freq(variant, rope, key, dev) for key in distinct]
        if len(distinct) == 1:
            inv, scaling = found[0]
            angles = pos[..., None].float() * inv
        else:
            which = torch.tensor([distinct.index(key) for key in keys], dtype=torch.long, device=device)
            per_key = which[inverse]  # [B, T] index of each key's table
            invs = torch.stack([f[0] for f in found])  # [K, rotary/2]
            angles = pos[..., None].float() * invs[per_key]
            if not all(f[1] == 1.0 for f in found):
                scaling = torch.tensor([f[1] for f in found], dtype=torch.float32, device=device)[per_key][..., None]
    cos, sin = angles.cos(), angles.sin()
    if isinstance(scaling, torch.Tensor) or scaling != 1.0:
        cos, sin = cos * scaling, sin * scaling
    return _Tables(cos[:, None], sin[:, None])


def _tables_for(rope: RopeSpec, positions, lengths, device, host) -> _Tables:
    if not isinstance(rope, RopeSpec):
        raise RopeError(
            f"expected a RopeSpec, got {type(rope).__name__}", "pass spec.rope_for_layer(i) of a RoPE model"
        )
    variant = variant_for(rope, host)
    if not (rope.is_stateful or variant.stateful):
        lengths = None
    device = torch.device(device)
    return _TABLES.lookup(
        (positions, lengths),
        (rope, variant, str(device)),
        lambda: _build_tables(rope, variant, _positions_2d(positions, device), lengths, device),
    )


def _check_keys(k: "Tensor", rope: RopeSpec, positions) -> None:
    if k.dim() != 4:
        raise RopeError(
            f"keys must be [batch, heads, tokens, head_dim], got shape {tuple(k.shape)}", "pass one layer's keys"
        )
    if k.shape[-1] != rope.head_dim:
        raise RopeError(
            f"keys have head_dim {k.shape[-1]} but the RoPE spec has head_dim {rope.head_dim}",
            "use the RoPE spec of the model that produced (or will read) these keys",
        )
    shape = tuple(torch.as_tensor(positions).shape)
    if shape[-1] != k.shape[2] or (len(shape) == 2 and shape[0] not in (1, k.shape[0])):
        raise RopeError(
            f"positions shape {shape} does not fit keys of shape {tuple(k.shape)}",
            "give one position per cached token ([batch, tokens])",
        )


# -- public API -----------------------------------------------------------------------------------
def tables(
    rope: RopeSpec, positions: "Tensor", *, lengths: "Tensor | None" = None, dtype=torch.float32, host=None
) -> tuple:
    """``(cos, sin)``, each ``[B, T, rotary_dim]`` in the model's layout, scaled, cast to ``dtype``."""
    tab = _tables_for(rope, positions, lengths, torch.as_tensor(positions).device, host)
    kernel = _Kernel(tab.cos, tab.sin, torch.float32)
    return tuple(kernel.full(which, rope.interleaved)[:, 0].to(dtype) for which in ("cos", "sin"))


def apply(
    k: "Tensor", positions: "Tensor", rope: RopeSpec, *, lengths: "Tensor | None" = None, dtype=None, host=None
) -> "Tensor":
    """Rotate content-space keys ``[B, H, T, D]`` at ``positions`` as the model does.

    ``dtype`` (default ``k.dtype``) is the cache dtype of the result. Keys already in it take the
    models' own rounding steps (bit-identical to them). Wider keys (float32 content of a
    half-precision cache) are rotated in their own dtype by the tables rounded to ``dtype`` (as
    the model holds them) and rounded to ``dtype`` once, at the end.
    """
    _check_keys(k, rope, positions)
    tab = _tables_for(rope, positions, lengths, k.device, host)
    dtype = dtype or k.dtype
    return tab.kernel(dtype, inverse=False, work=k.dtype).run(
        k, rope.rotary_dim, rope.interleaved, exact=dtype == k.dtype, out_dtype=dtype
    )


def strip(
    k: "Tensor", positions: "Tensor", rope: RopeSpec, *, lengths: "Tensor | None" = None, out_dtype=None, host=None
) -> "Tensor":
    """Undo :func:`apply`: keys back in content space (computed in float32 at least, rounded to
    ``out_dtype``, default ``k.dtype``; pass float32 to keep a half-precision cache's content
    unrounded for the mapping and :func:`apply`)."""
    _check_keys(k, rope, positions)
    tab = _tables_for(rope, positions, lengths, k.device, host)
    return tab.kernel(k.dtype, inverse=True).run(
        k, rope.rotary_dim, rope.interleaved, exact=False, out_dtype=out_dtype or k.dtype
    )


def reposition(
    k: "Tensor",
    old_positions: "Tensor",
    new_positions: "Tensor",
    rope: RopeSpec,
    *,
    old_lengths: "Tensor | None" = None,
    new_lengths: "Tensor | None" = None,
    host=None,
) -> "Tensor":
    """Keys rotated at ``old_positions`` moved to ``new_positions``: ``apply(strip(k, old), new)``.

    Keys take one rotation by the composite table (the product of the new table and the inverse
    of the old one, formed in float64 from the tables as strip and apply use them), in float64
    for float32 keys and float32 for half-precision ones, rounded once to the keys' dtype (one
    rounding, not three: a round trip by +d then -d is within one ulp).
    """
    _check_keys(k, rope, old_positions)
    _check_keys(k, rope, new_positions)
    old = _tables_for(rope, old_positions, old_lengths, k.device, host)
    new = _tables_for(rope, new_positions, new_lengths, k.device, host)
    # float32 keys rotate in float64 (one correctly rounded result: a +d/-d round trip stays within
    # one ulp); half-precision keys in float32, which is already exact enough for that
    work = torch.float64 if k.dtype in (torch.float64, torch.float32) else torch.float32

    def build() -> _Kernel:
        # (cos_new + i sin_new) * (cos_old - i sin_old) / (cos_old^2 + sin_old^2), in float64,
        # from the tables exactly as strip and apply use them
        co, so = (t.to(torch.float64) for t in old.rounded(k.dtype))
        cn, sn = (t.to(torch.float64) for t in new.rounded(k.dtype))
        z = torch.complex(cn, sn) * torch.complex(co, -so) / (co * co + so * so)
        return _Kernel(z.real.to(work).contiguous(), z.imag.to(work).contiguous(), work)

    kernel = _FUSED.lookup((old, new), (k.dtype,), build)
    return kernel.run(k, rope.rotary_dim, rope.interleaved, exact=False, out_dtype=k.dtype)
