"""An optional compiled (``torch.compile``) kernel for the half-split RoPE rotation.

The eager half-split rotation in :mod:`kvbridge.rope` takes three or four elementwise kernels
(the models' own ``x*cos + rotate_half(x)*sin`` has separate rounding steps, so it cannot be
one multiply-add); a compiled kernel does it in one pass over the keys: one read, one write,
which is the memory-bandwidth floor of any elementwise op (BENCHMARKS.md, "RoPE codec").

It is **opt-in** (``KVBRIDGE_ROPE_COMPILE=1`` or :func:`set_mode`), because the first call
compiles (seconds on a CPU, more on a cold cache): worth it in a long-running process that
moves many caches, not in a one-shot CLI call. It is used only where it can be trusted:

- the rotation covers the whole head (no partial rotary) of a half-split layout;
- ``emulate_precision_casts`` makes inductor round every bfloat16/float16 intermediate as
  eager torch does, so the exact path stays bit-identical to the models;
- the first call for each (device, dtypes, exactness) is checked against the eager kernel
  (bit for bit when exact, else within two roundings of the output dtype); a failure to compile (no C++ compiler,
  unsupported backend) or a mismatch turns the compiled path off for that key, with one
  warning, and the eager kernel answers. So it works everywhere, compiled or not.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

ENV = "KVBRIDGE_ROPE_COMPILE"
_MODE: dict = {"mode": None}  # None: read ENV on first use
_FN: dict = {}
_STATUS: dict = {}  # key -> True (checked, in use) / False (disabled)


def set_mode(mode: str | None) -> None:
    """``"compiled"`` / ``"eager"`` for this process; ``None``: back to ``$KVBRIDGE_ROPE_COMPILE``."""
    if mode not in (None, "compiled", "eager"):
        raise ValueError(f"RoPE kernel mode must be 'compiled' or 'eager', got {mode!r}")
    _MODE["mode"] = mode
    _STATUS.clear()


def mode() -> str:
    if _MODE["mode"] is None:
        raw = os.environ.get(ENV, "").strip().lower()
        _MODE["mode"] = "compiled" if raw in ("1", "true", "yes", "on", "compiled") else "eager"
    return _MODE["mode"]


def _rotate(x: "Tensor", cos: "Tensor", sin: "Tensor", out_dtype: torch.dtype) -> "Tensor":
    """Half-split rotation of ``x [..., 2h]`` by ``cos``/``sin [..., h]`` in the tables' dtype."""
    xv = x.unflatten(-1, (2, cos.shape[-1])).to(cos.dtype)
    x1, x2 = xv[..., 0, :], xv[..., 1, :]
    # x1*c + (-x2)*s == x1*c - x2*s exactly; each product and sum rounded, as the models do
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-2).flatten(-2).to(out_dtype)


def _compiled() -> Callable:
    if "fn" not in _FN:
        _FN["fn"] = torch.compile(_rotate, dynamic=True, options={"emulate_precision_casts": True})
    return _FN["fn"]


def rotate(x: "Tensor", cos: "Tensor", sin: "Tensor", out_dtype: torch.dtype, *, exact: bool,
           eager: Callable[[], "Tensor"]) -> "Tensor":
    """The compiled rotation when enabled and verified for this key, else ``eager()``."""
    if mode() != "compiled":
        return eager()
    key = (x.device.type, x.dtype, cos.dtype, out_dtype, exact)
    status = _STATUS.get(key)
    if status is False:
        return eager()
    try:
        out = _compiled()(x, cos, sin, out_dtype)
    except Exception as exc:  # no compiler, unsupported backend...: eager from now on
        _STATUS[key] = False
        warnings.warn(f"kvbridge: compiled RoPE kernel unavailable ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); using the eager kernel",
                      RuntimeWarning, stacklevel=3)
        return eager()
    if status is None:
        want = eager()
        if exact:
            ok = torch.equal(out, want)
        else:  # one rounding of the output dtype apart at most
            tol = 2 * torch.finfo(out_dtype).eps * max(1.0, float(want.abs().max()))
            ok = out.shape == want.shape and float((out.float() - want.float()).abs().max()) <= tol
        _STATUS[key] = bool(ok)
        if not ok:
            warnings.warn("kvbridge: compiled RoPE kernel disagrees with the eager one on "
                          f"{key}; using the eager kernel", RuntimeWarning, stacklevel=3)
            return want
    return out


__all__ = ["ENV", "set_mode", "mode", "rotate"]
