"""The rotation kernels of the RoPE codec (:mod:`kvbridge.rope`): a rotation by half cos/sin tables
in one compute dtype, eager (three kernels for half-split, complex multiply for interleaved) or
one pass (:mod:`kvbridge.rope_native`: a C++ kernel, verified against the eager one), and the
choice between them (:func:`fast_rotate`): :func:`set_mode`, else ``$KVBRIDGE_ROPE_KERNEL``:

- ``auto`` (the default): native where it can run (a CPU tensor, float32/bfloat16, a C++ compiler
  to build it once per machine), else the eager kernels, silently; a build that failed is not
  retried by later processes;
- ``native``: the same, but unavailability is a warning (once per process);
- ``eager``: the torch kernels below.

``compiled`` (a ``torch.compile`` kernel, removed: slower than the native one on every row it ran,
BENCHMARKS.md, "RoPE fast path") and ``KVBRIDGE_ROPE_COMPILE=1`` are accepted with a deprecation
warning and mean ``native``. The first result per (device, dtypes, exactness) is checked against
the eager kernel (bit for bit when exact, else within two roundings of the output dtype); a failure
or a mismatch turns the kernel off for that key (one warning; a mismatch warns in ``auto`` too)
and the eager kernel answers.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import TYPE_CHECKING, Callable

import torch

from kvbridge import rope_native

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor


KERNEL_ENV = "KVBRIDGE_ROPE_KERNEL"
LEGACY_ENV = "KVBRIDGE_ROPE_COMPILE"  # deprecated: 1 asked for the removed compiled kernel
MODES = ("auto", "eager", "native")
_MODE: dict = {"mode": None}  # None: read the environment on first use
_STATUS: dict = {}  # key -> True (checked, in use) / False (disabled)
_WARNED: set = set()  # messages already given in this process
_REMOVED = "the compiled (torch.compile) RoPE kernel was removed (the native one is faster); using native"


def _once(message: str, stacklevel: int = 3) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def set_mode(mode: str | None) -> None:
    """``"auto"`` / ``"eager"`` / ``"native"`` for this process (``"compiled"``: deprecated, native);
    ``None``: back to the environment (default ``auto``)."""
    if mode == "compiled":
        _once(f"kvbridge: RoPE kernel mode 'compiled' is deprecated: {_REMOVED}")
        mode = "native"
    if mode is not None and mode not in MODES:
        raise ValueError(f"RoPE kernel mode must be one of {', '.join(MODES)}, got {mode!r}")
    _MODE["mode"] = mode
    _STATUS.clear()


@contextlib.contextmanager
def using(mode: str):
    """Run a block on the ``mode`` kernel, then restore the previous mode and what its first-use
    checks had found (benchmarks and tests comparing kernels side by side)."""
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
        legacy = os.environ.get(LEGACY_ENV, "").strip().lower() in ("1", "true", "yes", "on", "compiled")
        if raw == "compiled" or (raw not in MODES and legacy):
            _once(f"kvbridge: ${KERNEL_ENV}=compiled / ${LEGACY_ENV}=1 are deprecated: {_REMOVED}")
            raw = "native"
        elif raw and raw not in MODES:
            _once(f"kvbridge: ${KERNEL_ENV}={raw!r} is not one of {', '.join(MODES)}; using the default (auto)")
        _MODE["mode"] = raw if raw in MODES else "auto"
    return _MODE["mode"]


def fast_rotate(
    x: "Tensor",
    cos: "Tensor",
    sin: "Tensor",
    out_dtype: torch.dtype,
    *,
    exact: bool,
    eager: Callable[[], "Tensor"],
    rotary_dim: int,
) -> "Tensor":
    """The native rotation of ``x``'s first ``rotary_dim`` dims when the mode allows it, it takes these
    inputs and it is verified for this key; else ``eager()``."""
    chosen = mode()
    if chosen == "eager" or not rope_native.supports(x, cos, sin, out_dtype, exact=exact, rotary_dim=rotary_dim):
        return eager()  # another device, dtype or layout: the eager kernels, no warning
    quiet = chosen == "auto"  # the default: unavailability is silent (no compiler: eager, as before)
    key = ("native", x.device.type, x.dtype, cos.dtype, out_dtype, exact)
    status = _STATUS.get(key)
    if status is False:
        return eager()
    try:
        out = rope_native.rotate(
            x, cos, sin, out_dtype, exact=exact, rotary_dim=rotary_dim, retry_failed=not quiet, checked=True
        )
    except Exception as exc:  # no compiler, a failed build...: eager from now on
        _STATUS[key] = False
        if not quiet:
            detail = str(exc).splitlines()[0][:200] if str(exc) else ""
            _once(f"kvbridge: native RoPE kernel unavailable ({type(exc).__name__}: {detail}); using the eager kernel")
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
                f"kvbridge: native RoPE kernel disagrees with the eager one on {key}; using the eager kernel",
                RuntimeWarning,
                stacklevel=3,
            )
            return want
    return out


class _Kernel:
    """A rotation by (cos, sin) half tables in one compute dtype, applied to a key tensor."""

    __slots__ = ("cos", "sin", "nsin", "dtype", "_memo")

    def __init__(self, cos: "Tensor", sin: "Tensor", dtype):
        self.cos, self.sin, self.nsin, self.dtype = cos, sin, -sin, dtype
        self._memo: dict = {}

    def _get(self, name: str, make: Callable[[], "Tensor"]) -> "Tensor":
        if name not in self._memo:
            self._memo[name] = make()
        return self._memo[name]

    def full(self, which: str, interleaved: bool) -> "Tensor":
        """cos or sin half table laid out over ``rotary_dim`` (doubled, or each entry twice)."""
        t = self.cos if which == "cos" else self.sin
        return self._get(
            f"{which}-{interleaved}",
            lambda: torch.repeat_interleave(t, 2, dim=-1) if interleaved else torch.cat((t, t), dim=-1),
        )

    def run(self, k: "Tensor", rotary_dim: int, interleaved: bool, *, exact: bool = True, out_dtype=None) -> "Tensor":
        """``k`` rotated on its first ``rotary_dim`` dims, as a new tensor in ``out_dtype``.

        Half-split rotations go through the native one-pass kernel where it runs
        (:func:`fast_rotate`: verified, falling back to eager); else the eager kernel.
        """
        out_dtype = out_dtype or self.dtype

        def eager() -> "Tensor":
            return self.eager(k, rotary_dim, interleaved, exact=exact).to(out_dtype)

        if interleaved:
            return eager()
        return fast_rotate(k, self.cos, self.sin, out_dtype, exact=exact, rotary_dim=rotary_dim, eager=eager)

    def eager(self, k: "Tensor", rotary_dim: int, interleaved: bool, *, exact: bool = True) -> "Tensor":
        """``k`` rotated on its first ``rotary_dim`` dims, as a new tensor in ``self.dtype`` (eager torch).

        ``exact``: ``k`` is in ``self.dtype`` and the rotation takes the rounding steps of the
        models' ``x*cos + rotate(x)*sin`` (one per product, one per sum: bit-identical to
        them). Otherwise (strip, reposition: not bit targets) ``k`` may be in a narrower
        dtype (read directly on GPU, converted first on CPU) and the rotation takes the fewest
        passes: one complex multiply for interleaved pairs, multiply + multiply-add for
        half-split ones (within an ulp of the exact steps).
        """
        r, h = rotary_dim, rotary_dim // 2
        out = torch.empty(k.shape, dtype=self.dtype, device=k.device)
        if r < k.shape[-1]:
            out[..., r:] = k[..., r:]
        src, dst = k[..., :r], out[..., :r]
        if not exact and k.dtype != self.dtype and (interleaved or k.device.type == "cpu"):
            src = src.to(self.dtype)  # mixed-dtype kernels are slow on the CPU: convert first
        cplx = interleaved and src.dtype in (torch.float32, torch.float64) and _complex_ok(src)
        if not exact and cplx:  # pairs (2i, 2i+1) are complex numbers: one complex multiply rotates them
            z = self._get("complex", lambda: torch.complex(self.cos, self.sin))
            zc = torch.view_as_complex(src.unflatten(-1, (h, 2)))
            torch.mul(zc, z, out=torch.view_as_complex(dst.unflatten(-1, (h, 2))))
            return out
        if not interleaved:  # both halves times cos in one broadcast multiply into the output, then:
            xv, ov = src.unflatten(-1, (2, h)), dst.unflatten(-1, (2, h))
            torch.mul(xv, self.cos.unsqueeze(-2), out=ov)
            if not exact:  # one multiply-add per half
                ov[..., 0, :].addcmul_(xv[..., 1, :], self.nsin)
                ov[..., 1, :].addcmul_(xv[..., 0, :], self.sin)
                return out
            # x*cos + rotate_half(x)*sin with the models' rounding steps, in three kernels: the two
            # sin products into one scratch tensor ((-x2)*s == x2*(-s) exactly), one add
            tmp = torch.empty(xv.shape, dtype=self.dtype, device=k.device)
            torch.mul(xv[..., 1, :], self.nsin, out=tmp[..., 0, :])
            torch.mul(xv[..., 0, :], self.sin, out=tmp[..., 1, :])
            ov.add_(tmp)
            return out
        # x*cos + rotate(x)*sin, one rounding per product and one per sum, as the models do (not exact:
        # ``src`` is already in ``self.dtype``, converted above)
        torch.mul(src, self.full("cos", interleaved), out=dst)
        if cplx:
            # rotate_every_two(x) = (-x_odd, x_even) = i * (x_even + i x_odd): exact, and contiguous
            unit = self._get(
                "i",
                lambda: torch.tensor(
                    1j, dtype=torch.complex128 if self.dtype == torch.float64 else torch.complex64, device=src.device
                ),
            )
            swapped = torch.view_as_real(torch.view_as_complex(src.unflatten(-1, (h, 2))) * unit).flatten(-2)
            swapped.mul_(self.full("sin", True))
        else:  # interleaved pairs that cannot be viewed as complex numbers
            swapped = torch.empty_like(dst)
            torch.mul(src[..., 1::2], self.nsin, out=swapped[..., 0::2])
            torch.mul(src[..., 0::2], self.sin, out=swapped[..., 1::2])
        dst.add_(swapped)
        return out


def _complex_ok(t: "Tensor") -> bool:
    return t.stride(-1) == 1 and all(s % 2 == 0 for s in t.stride()[:-1]) and t.storage_offset() % 2 == 0
