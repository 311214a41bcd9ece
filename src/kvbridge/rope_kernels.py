"""The rotation kernels of the RoPE codec (:mod:`kvbridge.rope`): a rotation by half cos/sin tables
in one compute dtype, eager (three kernels for half-split, complex multiply for interleaved) or
one pass (:mod:`kvbridge.rope_native`: a C++ kernel, verified against the eager one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from kvbridge import rope_native

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor


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
        (:func:`kvbridge.rope_native.fast_rotate`: verified, falling back to eager); else the eager kernel.
        """
        out_dtype = out_dtype or self.dtype
        if not interleaved:
            return rope_native.fast_rotate(
                k,
                self.cos,
                self.sin,
                out_dtype,
                exact=exact,
                rotary_dim=rotary_dim,
                eager=lambda: self.eager(k, rotary_dim, interleaved, exact=exact).to(out_dtype),
            )
        return self.eager(k, rotary_dim, interleaved, exact=exact).to(out_dtype)

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
        if not exact:
            if cplx:  # pairs (2i, 2i+1) are complex numbers: one complex multiply rotates them
                z = self._get("complex", lambda: torch.complex(self.cos, self.sin))
                zc = torch.view_as_complex(src.unflatten(-1, (h, 2)))
                torch.mul(zc, z, out=torch.view_as_complex(dst.unflatten(-1, (h, 2))))
                return out
            if not interleaved:
                # both halves times cos in one broadcast multiply, then one multiply-add per half
                xv, ov = src.unflatten(-1, (2, h)), dst.unflatten(-1, (2, h))
                torch.mul(xv, self.cos.unsqueeze(-2), out=ov)
                ov[..., 0, :].addcmul_(xv[..., 1, :], self.nsin)
                ov[..., 1, :].addcmul_(xv[..., 0, :], self.sin)
                return out
            src = src.to(self.dtype)
        if not interleaved:
            # x*cos + rotate_half(x)*sin with the models' rounding steps, in three kernels: both
            # halves times cos (one broadcast multiply into the output), the two sin products into
            # one scratch tensor ((-x2)*s == x2*(-s) exactly), one add
            xv, ov = src.unflatten(-1, (2, h)), dst.unflatten(-1, (2, h))
            torch.mul(xv, self.cos.unsqueeze(-2), out=ov)
            tmp = torch.empty(xv.shape, dtype=self.dtype, device=k.device)
            torch.mul(xv[..., 1, :], self.nsin, out=tmp[..., 0, :])
            torch.mul(xv[..., 0, :], self.sin, out=tmp[..., 1, :])
            ov.add_(tmp)
            return out
        # x*cos + rotate(x)*sin, one rounding per product and one per sum, as the models do
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
