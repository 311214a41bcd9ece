"""Built-in RoPE variants: default, linear, dynamic, yarn, longrope, llama3.

The inverse-frequency math of the built-in types lives here (the :class:`RopeVariant` type,
like every plugin type, in :mod:`kvbridge.plugin_types`) so that registering them needs no
torch (``kvbridge plugins`` stays fast): each ``inv_freq`` imports torch when called. The
codec that uses them, :mod:`kvbridge.rope`, finds them through the plugin host.

The frequencies are computed with the same operations, in the same order and precision, as
transformers 5.x ``modeling_rope_utils`` (float32 on the CPU), so the tables are bit-identical:
one ulp of ``inv_freq`` would cost ~1e-3 rad at position 40k.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from kvbridge.spec import RopeSpec
from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import RopeError, RopeVariant, UnknownRopeTypeError  # noqa: F401  (re-exported)

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

__all__ = ["RopeVariant", "RopeError", "UnknownRopeTypeError", "BUILTIN_VARIANTS", "kvbridge_register_rope_variants"]


# -- inverse frequencies of the built-in types (bit-equal to transformers': see the module docstring) --
def _need(rope: RopeSpec, name: str, default: Any = None) -> Any:
    value = rope.param(name, default)
    if value is None:
        raise RopeError(
            f"RoPE type {rope.rope_type!r} needs parameter {name!r}, which the spec lacks",
            f"add {name!r} to the config's rope_parameters",
        )
    return value


def _dim(rope: RopeSpec) -> int:
    dim = rope.rotary_dim
    if dim < 2:
        raise RopeError(
            f"RoPE rotary_dim {dim} (head_dim {rope.head_dim} x partial_factor "
            f"{rope.partial_factor}) is too small to rotate",
            "check head_dim and partial_rotary_factor",
        )
    return dim


def _exponents(dim: int, device) -> "Tensor":
    """``arange(0, dim, 2) / dim`` in float32 (every HF variant computes exactly this)."""
    import torch

    return torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim


def _default_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    return 1.0 / (rope.theta ** _exponents(_dim(rope), device)), 1.0


def _linear_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    return _default_inv_freq(rope, device=device)[0] / float(_need(rope, "factor")), 1.0


def _dynamic_table_length(rope: RopeSpec, seq_len: int) -> int | None:
    return int(seq_len) if int(seq_len) > rope.max_position_embeddings else None


def _dynamic_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    """Dynamic NTK: the base grows with the forward length once it exceeds the max positions.

    Up to ``max_position_embeddings`` the model keeps its init table (base computed in Python
    floats); past it, transformers recomputes the base from the forward length as a 0-d int64
    tensor, i.e. in float32 arithmetic, and so do we.
    """
    import torch

    dim = _dim(rope)
    factor = float(_need(rope, "factor"))
    max_pos = rope.max_position_embeddings
    exponent = dim / (dim - 2) if dim > 2 else 1.0
    past = seq_len is not None and int(seq_len) > max_pos  # else the init table: max_pos, a Python int
    length = torch.tensor(int(seq_len), dtype=torch.int64, device=device) if past else max_pos
    base = rope.theta * ((factor * length / max_pos) - (factor - 1)) ** exponent
    return 1.0 / (base ** _exponents(dim, device)), 1.0


def _original_factor(rope: RopeSpec) -> tuple[int, float]:
    """(pretraining context, scaling factor) of YaRN / LongRoPE; the factor defaults to max positions / context."""
    original = int(rope.param("original_max_position_embeddings") or rope.max_position_embeddings)
    factor = rope.param("factor")
    return original, float(rope.max_position_embeddings / original if factor is None else factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    import torch

    dim = _dim(rope)
    base = rope.theta
    original, factor = _original_factor(rope)
    attention = rope.param("attention_factor")
    if attention is None:
        mscale, mscale_all = rope.param("mscale"), rope.param("mscale_all_dim")
        if mscale and mscale_all:
            attention = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all))
        else:
            attention = _yarn_mscale(factor)
    beta_fast = rope.param("beta_fast") or 32
    beta_slow = rope.param("beta_slow") or 1
    truncate = rope.param("truncate") is None or bool(rope.param("truncate"))  # unset or null: True

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


def _longrope_table_length(rope: RopeSpec, seq_len: int) -> int | None:
    original = _original_factor(rope)[0]
    return original + 1 if int(seq_len) > original else None


def _longrope_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    """LongRoPE (Phi-3): per-frequency factors, short up to the original context, long above."""
    import torch

    dim = _dim(rope)
    original, factor = _original_factor(rope)
    long_f, short_f = _need(rope, "long_factor"), _need(rope, "short_factor")
    attention = rope.param("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    use_long = bool(seq_len) and int(seq_len) > original
    factors = long_f if use_long else short_f
    if len(factors) != dim // 2:
        which = "long_factor" if use_long else "short_factor"
        raise RopeError(
            f"longrope {which} has {len(factors)} entries, rotary_dim {dim} needs {dim // 2}",
            "fix rope_parameters (one factor per rotary frequency)",
        )
    ext = torch.tensor(list(factors), dtype=torch.float32, device=device)
    inv = 1.0 / (ext * rope.theta ** _exponents(dim, device))
    return inv, float(attention)


def _llama3_inv_freq(rope: RopeSpec, seq_len: int | None = None, device=None):
    """Llama 3.1: long wavelengths divided by ``factor``, short ones kept, a smooth ramp between."""
    import torch

    inv = _default_inv_freq(rope, device=device)[0]
    factor, low_f, high_f = (float(_need(rope, k)) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    context = _need(rope, "original_max_position_embeddings", rope.max_position_embeddings)
    low_wavelen, high_wavelen = context / low_f, context / high_f
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (context / wavelen - low_f) / (high_f - low_f)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


BUILTIN_VARIANTS: dict[str, RopeVariant] = {
    v.name: v
    for v in (
        RopeVariant("default", _default_inv_freq, "original RoPE: theta^(-2i/d)"),
        RopeVariant("linear", _linear_inv_freq, "position interpolation: frequencies / factor"),
        RopeVariant(
            "dynamic",
            _dynamic_inv_freq,
            "dynamic NTK: base grows with the forward length past max_position_embeddings",
            stateful=True,
            table_length=_dynamic_table_length,
        ),
        RopeVariant("yarn", _yarn_inv_freq, "YaRN: ramped interpolation plus attention scaling"),
        RopeVariant(
            "longrope",
            _longrope_inv_freq,
            "LongRoPE: short/long per-frequency factors around original_max_position_embeddings",
            stateful=True,
            table_length=_longrope_table_length,
        ),
        RopeVariant("llama3", _llama3_inv_freq, "Llama 3.1: wavelength-dependent smooth scaling"),
    )
}


@hookimpl
def kvbridge_register_rope_variants(register):
    for variant in BUILTIN_VARIANTS.values():
        register(variant)
