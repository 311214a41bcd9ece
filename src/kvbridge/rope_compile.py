"""The kernel choice for the half-split RoPE rotation, and the optional compiled (``torch.compile``) kernel.

The eager half-split rotation in :mod:`kvbridge.rope` takes three or four elementwise kernels
(the models' own ``x*cos + rotate_half(x)*sin`` has separate rounding steps, so it cannot be
one multiply-add); a compiled kernel does it in one pass over the keys: one read, one write,
which is the memory-bandwidth floor of any elementwise op (BENCHMARKS.md, "RoPE codec").

Modes (:func:`set_mode`, else ``$KVBRIDGE_ROPE_KERNEL``; ``KVBRIDGE_ROPE_COMPILE=1`` means
``compiled``):

- ``auto`` (the default): ``native`` where it can run (a CPU tensor, float32/bfloat16, a C++
  compiler to build it once per machine), else eager, silently: no compiler means the eager
  kernels, as before; a build that failed is not retried by later processes.
- ``native``: :mod:`kvbridge.rope_native`, a small C++ kernel built once (~1 s of compiler CPU time) with
  the system compiler and cached; unavailability is a warning (once per process).
- ``compiled``: ``torch.compile`` of the rotation below. **Opt-in**, because the first call of
  every process compiles (seconds on a CPU, more on a cold cache), and it is slower than the
  native kernel on the CPU; it is the one-pass kernel for other devices (CUDA).
- ``eager``: the torch kernels of :mod:`kvbridge.rope_kernels`.

A non-eager kernel is used only where it can be trusted:

- the compiled one rotates whole heads (no partial rotary) of a half-split layout, and
  ``emulate_precision_casts`` makes inductor round every bfloat16/float16 intermediate as
  eager torch does, so the exact path stays bit-identical to the models;
- the first call for each (kernel, device, dtypes, exactness) is checked against the eager
  kernel (bit for bit when exact, else within two roundings of the output dtype); a failure
  (no compiler, unsupported backend) or a mismatch turns that kernel off for that key, with one
  warning (a mismatch warns in ``auto`` too), and the eager kernel answers. So it works
  everywhere, fast or not.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

ENV = "KVBRIDGE_ROPE_COMPILE"
KERNEL_ENV = "KVBRIDGE_ROPE_KERNEL"
MODES = ("auto", "eager", "compiled", "native")
_MODE: dict = {"mode": None}  # None: read ENV on first use
_FN: dict = {}
_STATUS: dict = {}  # key -> True (checked, in use) / False (disabled)
_WARNED: set = set()  # unavailability messages already given in this process


def set_mode(mode: str | None) -> None:
    """``"auto"`` / ``"eager"`` / ``"compiled"`` / ``"native"`` for this process; ``None``: back to
    the environment (default ``auto``: native where it builds, silently eager elsewhere)."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"RoPE kernel mode must be one of {', '.join(MODES)}, got {mode!r}")
    _MODE["mode"] = mode
    _STATUS.clear()


@contextlib.contextmanager
def using(mode: str):
    """Run a block on the ``mode`` kernel, then restore the previous mode and what its
    first-use checks had found (benchmarks and tests comparing kernels side by side)."""
    saved_mode, saved_status = _MODE["mode"], dict(_STATUS)
    set_mode(mode)
    try:
        yield
    finally:
        _MODE["mode"] = saved_mode
        _STATUS.clear()
        _STATUS.update(saved_status)


def mode() -> str:
    if _MODE["mode"] is None:
        raw = os.environ.get(KERNEL_ENV, "").strip().lower()
        if raw in MODES:
            _MODE["mode"] = raw
        else:
            if raw:
                warnings.warn(
                    f"kvbridge: ${KERNEL_ENV}={raw!r} is not one of {', '.join(MODES)}; using the default (auto)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            legacy = os.environ.get(ENV, "").strip().lower()
            _MODE["mode"] = "compiled" if legacy in ("1", "true", "yes", "on", "compiled") else "auto"
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


def rotate(
    x: "Tensor",
    cos: "Tensor",
    sin: "Tensor",
    out_dtype: torch.dtype,
    *,
    exact: bool,
    eager: Callable[[], "Tensor"],
    rotary_dim: int | None = None,
) -> "Tensor":
    """The selected kernel's rotation when it is verified for this key, else ``eager()``.

    ``rotary_dim`` (default: the whole head) rotates the first dims only (native kernel; the
    compiled one takes whole heads, partial rotations stay eager).
    """
    chosen = mode()
    quiet = chosen == "auto"  # the default: unavailability is silent (no compiler: eager, as before)
    if quiet:
        chosen = "native"
    rotary_dim = x.shape[-1] if rotary_dim is None else rotary_dim
    if chosen == "eager" or (chosen == "compiled" and rotary_dim != x.shape[-1]):
        return eager()
    if chosen == "native":
        from kvbridge import rope_native

        if not rope_native.supports(x, cos, sin, out_dtype, exact=exact, rotary_dim=rotary_dim):
            return eager()  # another device, dtype or layout: the eager kernels, no warning
    key = (chosen, x.device.type, x.dtype, cos.dtype, out_dtype, exact)
    status = _STATUS.get(key)
    if status is False:
        return eager()
    try:
        if chosen == "native":
            out = rope_native.rotate(
                x, cos, sin, out_dtype, exact=exact, rotary_dim=rotary_dim, retry_failed=not quiet, checked=True
            )
        else:
            out = _compiled()(x, cos, sin, out_dtype)
    except Exception as exc:  # no compiler, unsupported backend or inputs...: eager from now on
        _STATUS[key] = False
        message = (
            f"kvbridge: {chosen} RoPE kernel unavailable ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); using the eager kernel"
        )
        if not quiet and message not in _WARNED:  # once per process, whatever the mode changes
            _WARNED.add(message)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
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
            warnings.warn(
                f"kvbridge: {chosen} RoPE kernel disagrees with the eager one on {key}; using the eager kernel",
                RuntimeWarning,
                stacklevel=3,
            )
            return want
    return out


__all__ = ["ENV", "KERNEL_ENV", "MODES", "set_mode", "using", "mode", "rotate"]
