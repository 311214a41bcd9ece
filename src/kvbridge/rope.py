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

RoPE types are :class:`RopeVariant` objects: the built-ins live in :data:`BUILTIN_VARIANTS`
(and are registered by :mod:`kvbridge.builtin.rope_variants`); with a ``host`` the type is
looked up through the plugin host, so plugins can add types.

Performance: inverse frequencies are cached per ``(spec, length, device)``; the per-call
tables are cached per ``(spec, positions tensor, lengths tensor)`` by tensor identity and
version counter, so the 28 layers of one ``KVState.strip_rope()`` build the table once. The
rotation itself is one complex multiply (float32/float64, interleaved) or four elementwise
kernels (half split, or half precision), writing straight into the output.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from kvbridge.errors import ConfigError, PluginError
from kvbridge.spec import RopeSpec

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

__all__ = [
    "RopeVariant", "RopeError", "UnknownRopeTypeError", "BUILTIN_VARIANTS",
    "tables", "apply", "strip", "reposition", "forward_lengths", "inv_freq", "variant_for",
    "available_types", "clear_caches",
]


class RopeError(ConfigError):
    """A RoPE spec kvbridge cannot turn into a table (missing or malformed parameters)."""


class UnknownRopeTypeError(RopeError):
    """No built-in or plugin RoPE variant handles this ``rope_type``."""


@dataclass(frozen=True)
class RopeVariant:
    """One ``rope_type``: how its inverse frequencies follow from a :class:`RopeSpec`.

    ``inv_freq(rope, seq_len, device)`` returns ``(inv_freq, attention_scaling)``: a float32
    tensor of ``rope.rotary_dim // 2`` inverse frequencies and the factor the cos/sin tables
    are multiplied by. ``seq_len`` is the length of the forward the table is for (``None``:
    the static table the model builds at init). kvbridge always calls it with a CPU device and
    moves the result, as transformers computes the tables of a loaded model on the CPU.

    Optional: ``stateful`` marks a type whose table depends on the forward length (besides
    the built-in ``dynamic`` and ``longrope``); ``table_length(rope, seq_len)`` maps a forward
    length to a representative one with the same table (``None``: the static table), which
    lets the codec group keys of many lengths into few tables.
    """

    name: str
    inv_freq: Callable[..., tuple]
    description: str = ""
    stateful: bool = False
    table_length: Callable[[RopeSpec, int], "int | None"] | None = None


# ---------------------------------------------------------------------------------------------
# inverse frequencies of the built-in types (float32, CPU; the same operations, in the same
# order and precision, as transformers 5.x modeling_rope_utils, so the tables are bit-equal)
# ---------------------------------------------------------------------------------------------
def _need(rope: RopeSpec, name: str, default: Any = None) -> Any:
    value = rope.param(name, default)
    if value is None:
        raise RopeError(f"RoPE type {rope.rope_type!r} needs parameter {name!r}, which the spec lacks",
                        f"add {name!r} to the config's rope_parameters")
    return value


def _dim(rope: RopeSpec) -> int:
    dim = rope.rotary_dim
    if dim < 2:
        raise RopeError(f"RoPE rotary_dim {dim} (head_dim {rope.head_dim} x partial_factor "
                        f"{rope.partial_factor}) is too small to rotate",
                        "check head_dim and partial_rotary_factor")
    return dim


def _exponents(dim: int, device) -> "Tensor":
    """``arange(0, dim, 2) / dim`` in float32 (every HF variant computes exactly this)."""
    return torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim


def _default_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    dim = _dim(rope)
    return 1.0 / (rope.theta ** _exponents(dim, device)), 1.0


def _linear_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    dim = _dim(rope)
    factor = float(_need(rope, "factor"))
    inv = 1.0 / (rope.theta ** _exponents(dim, device))
    return inv / factor, 1.0


def _dynamic_table_length(rope: RopeSpec, seq_len: int) -> int | None:
    return int(seq_len) if int(seq_len) > rope.max_position_embeddings else None


def _dynamic_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    """Dynamic NTK: the base grows with the forward length once it exceeds the max positions.

    Up to ``max_position_embeddings`` the model keeps its init table (base computed in Python
    floats); past it, transformers recomputes the base from the forward length as a 0-d int64
    tensor, i.e. in float32 arithmetic, and so do we.
    """
    dim = _dim(rope)
    factor = float(_need(rope, "factor"))
    max_pos = rope.max_position_embeddings
    exponent = dim / (dim - 2) if dim > 2 else 1.0
    if seq_len is None or int(seq_len) <= max_pos:
        base = rope.theta * ((factor * max_pos / max_pos) - (factor - 1)) ** exponent
    else:
        length = torch.tensor(int(seq_len), dtype=torch.int64, device=device)
        base = rope.theta * ((factor * length / max_pos) - (factor - 1)) ** exponent
    return 1.0 / (base ** _exponents(dim, device)), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    dim = _dim(rope)
    base = rope.theta
    original = int(rope.param("original_max_position_embeddings") or rope.max_position_embeddings)
    factor = rope.param("factor")
    if factor is None:
        factor = rope.max_position_embeddings / original
    factor = float(factor)
    attention = rope.param("attention_factor")
    if attention is None:
        mscale, mscale_all = rope.param("mscale"), rope.param("mscale_all_dim")
        if mscale and mscale_all:
            attention = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all))
        else:
            attention = _yarn_mscale(factor)
    beta_fast = rope.param("beta_fast") or 32
    beta_slow = rope.param("beta_slow") or 1
    truncate = rope.param("truncate", True)
    truncate = True if truncate is None else bool(truncate)

    def correction_dim(rotations: float) -> float:
        # the (fractional) dim whose wavelength fits `rotations` turns in the original context
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001

    powers = base ** _exponents(dim, device)
    extrapolated = 1.0 / powers
    interpolated = 1.0 / (factor * powers)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp.to(device=device, dtype=torch.float32)  # share kept un-interpolated
    inv = interpolated * (1 - keep) + extrapolated * keep
    return inv, float(attention)


def _longrope_original(rope: RopeSpec) -> int:
    return int(rope.param("original_max_position_embeddings") or rope.max_position_embeddings)


def _longrope_table_length(rope: RopeSpec, seq_len: int) -> int | None:
    original = _longrope_original(rope)
    return original + 1 if int(seq_len) > original else None


def _longrope_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    """LongRoPE (Phi-3): per-frequency factors, short up to the original context, long above."""
    dim = _dim(rope)
    original = _longrope_original(rope)
    long_f, short_f = _need(rope, "long_factor"), _need(rope, "short_factor")
    factor = rope.param("factor")
    if factor is None:
        factor = rope.max_position_embeddings / original
    attention = rope.param("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    use_long = bool(seq_len) and int(seq_len) > original
    factors = long_f if use_long else short_f
    if len(factors) != dim // 2:
        which = "long_factor" if use_long else "short_factor"
        raise RopeError(f"longrope {which} has {len(factors)} entries, rotary_dim {dim} needs {dim // 2}",
                        "fix rope_parameters (one factor per rotary frequency)")
    ext = torch.tensor(list(factors), dtype=torch.float32, device=device)
    inv = 1.0 / (ext * rope.theta ** _exponents(dim, device))
    return inv, float(attention)


def _llama3_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    """Llama 3.1: long wavelengths divided by ``factor``, short ones kept, a smooth ramp between."""
    dim = _dim(rope)
    inv = 1.0 / (rope.theta ** _exponents(dim, device))
    factor = float(_need(rope, "factor"))
    low_f = float(_need(rope, "low_freq_factor"))
    high_f = float(_need(rope, "high_freq_factor"))
    context = _need(rope, "original_max_position_embeddings", rope.max_position_embeddings)
    low_wavelen, high_wavelen = context / low_f, context / high_f
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (context / wavelen - low_f) / (high_f - low_f)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


BUILTIN_VARIANTS: dict[str, RopeVariant] = {
    v.name: v for v in (
        RopeVariant("default", _default_inv_freq, "original RoPE: theta^(-2i/d)"),
        RopeVariant("linear", _linear_inv_freq, "position interpolation: frequencies / factor"),
        RopeVariant("dynamic", _dynamic_inv_freq,
                    "dynamic NTK: base grows with the forward length past max_position_embeddings",
                    stateful=True, table_length=_dynamic_table_length),
        RopeVariant("yarn", _yarn_inv_freq, "YaRN: ramped interpolation plus attention scaling"),
        RopeVariant("longrope", _longrope_inv_freq,
                    "LongRoPE: short/long per-frequency factors around original_max_position_embeddings",
                    stateful=True, table_length=_longrope_table_length),
        RopeVariant("llama3", _llama3_inv_freq, "Llama 3.1: wavelength-dependent smooth scaling"),
    )
}


# ---------------------------------------------------------------------------------------------
# lookup
# ---------------------------------------------------------------------------------------------
def available_types(host=None) -> list[str]:
    names = set(BUILTIN_VARIANTS)
    try:
        from kvbridge.plugins import get_host

        names |= set((host or get_host()).registry("rope_variant").names())
    except Exception:  # a broken host must not hide the built-ins from the message
        pass
    return sorted(names)


def variant_for(rope: RopeSpec, host=None) -> RopeVariant:
    """The :class:`RopeVariant` of ``rope.rope_type`` (through ``host`` when given)."""
    name = rope.rope_type
    if host is None and name in BUILTIN_VARIANTS:
        return BUILTIN_VARIANTS[name]
    try:
        if host is None:
            from kvbridge.plugins import get_host

            host = get_host()
        return host.rope_variant(name)
    except PluginError:
        pass
    raise UnknownRopeTypeError(f"unknown RoPE type {name!r}; available: {', '.join(available_types(host))}",
                               "install a plugin that registers it (kvbridge_register_rope_variants)")


def _is_stateful(rope: RopeSpec, variant: RopeVariant) -> bool:
    return rope.is_stateful or variant.stateful


@functools.lru_cache(maxsize=512)
def _cpu_inv_freq(variant: RopeVariant, rope: RopeSpec, seq_len: int | None) -> tuple:
    inv, scaling = variant.inv_freq(rope, seq_len, torch.device("cpu"))
    inv = torch.as_tensor(inv, dtype=torch.float32).reshape(-1).cpu()
    if inv.numel() != rope.rotary_dim // 2:
        raise RopeError(f"RoPE variant {variant.name!r} returned {inv.numel()} inverse frequencies, "
                        f"rotary_dim {rope.rotary_dim} needs {rope.rotary_dim // 2}",
                        "fix the variant's inv_freq")
    return inv, float(scaling)


@functools.lru_cache(maxsize=1024)
def _device_inv_freq(variant: RopeVariant, rope: RopeSpec, seq_len: int | None, device: str) -> tuple:
    inv, scaling = _cpu_inv_freq(variant, rope, seq_len)
    return inv.to(device), scaling


def inv_freq(rope: RopeSpec, seq_len: int | None = None, *, device=None, host=None) -> tuple:
    """``(inv_freq, attention_scaling)`` of ``rope`` at forward length ``seq_len`` (cached; read-only)."""
    variant = variant_for(rope, host)
    return _device_inv_freq(variant, rope, None if seq_len is None else int(seq_len),
                            str(torch.device(device or "cpu")))


def forward_lengths(positions: "Tensor") -> "Tensor":
    """The forward length one prefill of ``positions`` uses for its table: max position + 1 per row.

    transformers takes ``max(position_ids) + 1`` over the whole batch; rows of one batch of
    equal length (the usual case) agree with it.
    """
    positions = torch.as_tensor(positions)
    return (positions.amax(dim=-1, keepdim=True) + 1).expand(positions.shape)


# ---------------------------------------------------------------------------------------------
# per-call tables, cached by tensor identity
# ---------------------------------------------------------------------------------------------
class _Tables:
    """Half tables of one (spec, positions, lengths): float32 ``[Bp, 1, T, rotary_dim/2]``."""

    __slots__ = ("cos", "sin", "memo")

    def __init__(self, cos: "Tensor", sin: "Tensor"):
        self.cos, self.sin = cos, sin
        self.memo: dict = {}

    def rounded(self, dtype) -> tuple:
        """cos/sin as the model uses them: rounded to ``dtype`` (then held in that dtype)."""
        key = ("rounded", dtype)
        if key not in self.memo:
            self.memo[key] = (self.cos.to(dtype), self.sin.to(dtype))
        return self.memo[key]

    def kernel(self, dtype, inverse: bool) -> "_Kernel":
        """The rotation that applies (or, ``inverse``, undoes) these tables on ``dtype`` data."""
        key = ("kernel", dtype, inverse)
        if key not in self.memo:
            if not inverse:
                cos, sin = self.rounded(dtype)
                self.memo[key] = _Kernel(cos, sin, dtype)
            else:
                # undo the rotation the model did with tables rounded to its dtype: rotate by
                # -angle and divide by cos^2 + sin^2 (= attention_scaling^2), in float32 at least
                work = torch.float64 if dtype == torch.float64 else torch.float32
                cos, sin = (t.to(torch.float64) for t in self.rounded(dtype))
                norm = cos * cos + sin * sin
                self.memo[key] = _Kernel((cos / norm).to(work), (-sin / norm).to(work), work)
        return self.memo[key]


class _Kernel:
    """A rotation by (cos, sin) half tables in one compute dtype, applied to a key tensor."""

    __slots__ = ("cos", "sin", "nsin", "dtype", "_full", "_cplx")

    def __init__(self, cos: "Tensor", sin: "Tensor", dtype):
        self.cos, self.sin, self.nsin, self.dtype = cos, sin, -sin, dtype
        self._full: dict = {}
        self._cplx = None

    def full_cos(self, interleaved: bool) -> "Tensor":
        if interleaved not in self._full:
            c = self.cos
            self._full[interleaved] = (torch.repeat_interleave(c, 2, dim=-1) if interleaved
                                       else torch.cat((c, c), dim=-1))
        return self._full[interleaved]

    def complex(self) -> "Tensor":
        if self._cplx is None:
            self._cplx = torch.complex(self.cos, self.sin)
        return self._cplx

    def run(self, k: "Tensor", rotary_dim: int, interleaved: bool) -> "Tensor":
        """``k`` (already in ``self.dtype``) rotated on its first ``rotary_dim`` dims, new tensor."""
        r, h = rotary_dim, rotary_dim // 2
        out = torch.empty_like(k, memory_format=torch.contiguous_format)
        if r < k.shape[-1]:
            out[..., r:] = k[..., r:]
        src, dst = k[..., :r], out[..., :r]
        if interleaved and self.dtype in (torch.float32, torch.float64) and _complex_ok(src):
            # pairs (2i, 2i+1) are complex numbers: one complex multiply does the rotation
            # (products and one add each, as x*cos + rotate_every_two(x)*sin: bit-identical)
            zc = torch.view_as_complex(src.unflatten(-1, (h, 2)))
            torch.mul(zc, self.complex(), out=torch.view_as_complex(dst.unflatten(-1, (h, 2))))
            return out
        # x*cos + rotate(x)*sin with rotate(x) = (-x2, x1): the same rounding steps as the models
        torch.mul(src, self.full_cos(interleaved), out=dst)
        swapped = torch.empty_like(dst)
        if interleaved:
            torch.mul(src[..., 1::2], self.nsin, out=swapped[..., 0::2])
            torch.mul(src[..., 0::2], self.sin, out=swapped[..., 1::2])
        else:
            torch.mul(src[..., h:], self.nsin, out=swapped[..., :h])
            torch.mul(src[..., :h], self.sin, out=swapped[..., h:])
        dst.add_(swapped)
        return out


def _complex_ok(t: "Tensor") -> bool:
    return t.stride(-1) == 1 and all(s % 2 == 0 for s in t.stride()[:-1]) and t.storage_offset() % 2 == 0


class _IdentityCache:
    """A small LRU keyed by tensor identity + version counter (checked through weak refs)."""

    def __init__(self, size: int = 32):
        self.size = size
        self.items: OrderedDict = OrderedDict()

    @staticmethod
    def tensor_key(t: "Tensor | None"):
        if t is None:
            return None
        try:
            version = t._version
        except Exception:  # inference tensors have no version counter: key by content
            return ("content", tuple(t.shape), str(t.dtype), str(t.device), t.detach().cpu().numpy().tobytes())
        return ("id", id(t), version, t.data_ptr(), tuple(t.shape), t.stride(), str(t.dtype), str(t.device))

    def get(self, key, tensors: tuple):
        hit = self.items.get(key)
        if hit is None:
            return None
        refs, value = hit
        for ref, t in zip(refs, tensors):
            if ref is not None and ref() is not t:
                del self.items[key]
                return None
        self.items.move_to_end(key)
        return value

    def put(self, key, tensors: tuple, value) -> None:
        refs = tuple(None if (t is None or self.tensor_key(t)[0] == "content") else weakref.ref(t)
                     for t in tensors)
        self.items[key] = (refs, value)
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)


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
        raise RopeError(f"positions must be [batch, tokens], got shape {tuple(positions.shape)}",
                        "pass one position per cached token")
    return positions.to(device)


def _build_tables(rope: RopeSpec, variant: RopeVariant, positions: "Tensor",
                  lengths: "Tensor | None", device) -> _Tables:
    dev = str(device)
    pos = positions.to(device)
    angles_scale = None
    if not _is_stateful(rope, variant):
        inv, scaling = _device_inv_freq(variant, rope, None, dev)
        angles = pos[..., None].float() * inv
    else:
        lens = forward_lengths(pos) if lengths is None else torch.as_tensor(lengths).to(device)
        if lens.dim() == 1:
            lens = lens[None]
        lens = lens.expand(pos.shape) if lens.shape != pos.shape else lens
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
            scales = torch.tensor([f[1] for f in found], dtype=torch.float32, device=device)
            if not all(f[1] == 1.0 for f in found):
                angles_scale = scales[per_key][..., None]
            scaling = 1.0
    cos, sin = angles.cos(), angles.sin()
    if angles_scale is not None:
        cos, sin = cos * angles_scale, sin * angles_scale
    elif scaling != 1.0:
        cos, sin = cos * scaling, sin * scaling
    return _Tables(cos[:, None], sin[:, None])


def _tables_for(rope: RopeSpec, positions, lengths, device, host) -> _Tables:
    if not isinstance(rope, RopeSpec):
        raise RopeError(f"expected a RopeSpec, got {type(rope).__name__}",
                        "pass spec.rope_for_layer(i) of a RoPE model")
    variant = variant_for(rope, host)
    if not _is_stateful(rope, variant):
        lengths = None
    device = torch.device(device)
    tensors = (positions, lengths)
    key = (rope, variant, _IdentityCache.tensor_key(positions), _IdentityCache.tensor_key(lengths), str(device))
    found = _TABLES.get(key, tensors)
    if found is None:
        found = _build_tables(rope, variant, _positions_2d(positions, device), lengths, device)
        _TABLES.put(key, tensors, found)
    return found


def _check_keys(k: "Tensor", rope: RopeSpec, positions) -> None:
    if k.dim() != 4:
        raise RopeError(f"keys must be [batch, heads, tokens, head_dim], got shape {tuple(k.shape)}",
                        "pass one layer's keys")
    if k.shape[-1] < rope.rotary_dim:
        raise RopeError(f"keys have head_dim {k.shape[-1]} < rotary_dim {rope.rotary_dim} of the RoPE spec",
                        "use the RoPE spec of the model that produced these keys")
    shape = tuple(torch.as_tensor(positions).shape)
    t = shape[-1]
    if t != k.shape[2] or (len(shape) == 2 and shape[0] not in (1, k.shape[0])):
        raise RopeError(f"positions shape {shape} does not fit keys of shape {tuple(k.shape)}",
                        "give one position per cached token ([batch, tokens])")


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------
def tables(rope: RopeSpec, positions: "Tensor", *, lengths: "Tensor | None" = None,
           dtype=torch.float32, host=None) -> tuple:
    """``(cos, sin)``, each ``[B, T, rotary_dim]`` in the model's layout, scaled, cast to ``dtype``."""
    device = torch.as_tensor(positions).device
    tab = _tables_for(rope, positions, lengths, device, host)
    cos, sin = tab.cos[:, 0], tab.sin[:, 0]
    if rope.interleaved:
        cos, sin = torch.repeat_interleave(cos, 2, dim=-1), torch.repeat_interleave(sin, 2, dim=-1)
    else:
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    return cos.to(dtype), sin.to(dtype)


def apply(k: "Tensor", positions: "Tensor", rope: RopeSpec, *, lengths: "Tensor | None" = None,
          host=None) -> "Tensor":
    """Rotate content-space keys ``[B, H, T, D]`` at ``positions`` as the model does (result in k.dtype)."""
    _check_keys(k, rope, positions)
    tab = _tables_for(rope, positions, lengths, k.device, host)
    return tab.kernel(k.dtype, inverse=False).run(k, rope.rotary_dim, rope.interleaved)


def strip(k: "Tensor", positions: "Tensor", rope: RopeSpec, *, lengths: "Tensor | None" = None,
          host=None) -> "Tensor":
    """Undo :func:`apply`: keys back in content space (computed in float32 at least, cast back)."""
    _check_keys(k, rope, positions)
    tab = _tables_for(rope, positions, lengths, k.device, host)
    kernel = tab.kernel(k.dtype, inverse=True)
    out = kernel.run(k.to(kernel.dtype), rope.rotary_dim, rope.interleaved)
    return out.to(k.dtype)


def reposition(k: "Tensor", old_positions: "Tensor", new_positions: "Tensor", rope: RopeSpec, *,
               old_lengths: "Tensor | None" = None, new_lengths: "Tensor | None" = None,
               host=None) -> "Tensor":
    """Keys rotated at ``old_positions`` moved to ``new_positions``: ``apply(strip(k, old), new)``.

    float32/float64 keys take one rotation by the composite table (the product of the new
    table and the inverse of the old one, formed in float64: within 1 ulp of strip + apply);
    half-precision keys go through strip + apply, which reproduces the model's own rounding.
    """
    _check_keys(k, rope, old_positions)
    _check_keys(k, rope, new_positions)
    if k.dtype not in (torch.float32, torch.float64):
        return apply(strip(k, old_positions, rope, lengths=old_lengths, host=host), new_positions, rope,
                     lengths=new_lengths, host=host)
    old = _tables_for(rope, old_positions, old_lengths, k.device, host)
    new = _tables_for(rope, new_positions, new_lengths, k.device, host)
    tensors = (old_positions, old_lengths, new_positions, new_lengths)
    key = (id(old), id(new), k.dtype)
    kernel = _FUSED.get(key, (old, new))
    if kernel is None:
        inv = old.kernel(k.dtype, inverse=True)
        fwd = new.kernel(k.dtype, inverse=False)
        z = (torch.complex(fwd.cos.to(torch.float64), fwd.sin.to(torch.float64))
             * torch.complex(inv.cos.to(torch.float64), inv.sin.to(torch.float64)))
        kernel = _Kernel(z.real.to(k.dtype).contiguous(), z.imag.to(k.dtype).contiguous(), k.dtype)
        _FUSED.put(key, (old, new), kernel)
    del tensors
    return kernel.run(k, rope.rotary_dim, rope.interleaved)
