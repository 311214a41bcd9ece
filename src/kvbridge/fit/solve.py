"""The ridge solver on sufficient statistics, held-out R² from statistics alone, and fit helpers.

For one target (layer, KV head) and one of K / V, with centred co-moments of the training
observations (see :mod:`kvbridge.fit.stats`)::

    W = (Cxx + λ I)⁻¹ Cxy        b = ȳ - x̄ W        (y ≈ x W + b)

This is exactly scikit-learn's ``Ridge(alpha=λ, fit_intercept=True)``: the intercept is not
penalised and ``λ`` is added to the *summed* (not averaged) centred Gram matrix; the paper's
default is ``λ = 0.01``. All heads of one target layer share their features, so one Cholesky
factor serves every head (and K and V are solved apart, with their own features).

Held-out R² needs no held-out samples either: with held-out statistics ``(n, x̄ₕ, ȳₕ, C*)``
the squared error of a fitted ``(W, b)`` is
``tr Cyy - 2 tr WᵀCxy + tr WᵀCxxW + n ||ȳₕ - x̄ₕW - b||²`` per output dim, and
``R² = 1 - SSE / SST`` pools the dims of one head (``SST = Σ diag Cyy`` about the held-out
mean).

Shared by every built-in fitter (``ridge``, ``ridge-headwise``, ``sklearn``) and by
:mod:`~kvbridge.fit.select`; it imports neither, so there is no import cycle.
"""

from __future__ import annotations

import math

import torch

from kvbridge.errors import KVBridgeError
from kvbridge.fit.plan import default_budget as plan_budget, pack_blocks
from kvbridge.fit.stats import DTYPE, Moments

DEFAULT_ALPHA = 0.01


class FitError(KVBridgeError):
    """A fit that cannot be made (underdetermined, singular, no held-out data)."""


def require_calibration(calibration, fitter: str, single: str = "", fix: str = "run it as a single process") -> None:
    """Refuse a fit without calibration data and, with ``single`` (why one process), a distributed one."""
    if calibration is None:
        raise FitError(f"the {fitter} fitter needs calibration data", "pass a corpus (kvbridge fit --corpus)")
    if single and calibration.world > 1:
        raise FitError(f"the {fitter} fitter {single} and cannot run distributed", fix)


def solve(m: Moments, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W [p, q], b [q])`` of the centred ridge on statistics ``m``."""
    w = solve_w(m, alpha)
    return w, m.mean_y - m.mean_x @ w


def solve_w(m: Moments, alpha: float) -> torch.Tensor:
    """``W [p, q]`` of the centred ridge on statistics ``m`` (:func:`solve` without the intercept)."""
    a = m.cxx.to(DTYPE, copy=True)
    a.diagonal().add_(float(alpha))
    chol, info = torch.linalg.cholesky_ex(a)
    if int(info) != 0:  # not positive definite (alpha 0 on collinear features): least-squares fallback
        return torch.linalg.lstsq(a, m.cxy.to(DTYPE)).solution
    del a  # only the fallback reads it: the solve holds the factor and its result, not a third p x p
    if m.q >= m.p:  # many right-hand sides: the explicit SPD inverse and one GEMM beat two TRSMs
        return torch.cholesky_inverse(chol) @ m.cxy.to(DTYPE)
    return torch.cholesky_solve(m.cxy.to(DTYPE), chol)


def sse(w: torch.Tensor, b: torch.Tensor, held: Moments) -> torch.Tensor:
    """Per output dim squared error of ``x W + b`` on the held-out statistics ``held``."""
    quad = (w * (held.cxx @ w)).sum(0)
    cross = (w * held.cxy).sum(0)
    resid_mean = held.mean_y - held.mean_x @ w - b
    return (held.cyy - 2.0 * cross + quad + held.n * resid_mean * resid_mean).clamp(min=0.0)


def grouped_r2(w: torch.Tensor, b: torch.Tensor, held: Moments, groups: int) -> torch.Tensor:
    """R² per group of ``q / groups`` consecutive output dims (one group per target head)."""
    e = sse(w, b, held).reshape(groups, -1).sum(1)
    t = held.cyy.reshape(groups, -1).sum(1)
    return torch.where(t > 0, 1.0 - e / t.clamp(min=1e-300), torch.zeros_like(t))


def alpha_grid(m: Moments) -> list[float]:
    scale = float(torch.diagonal(m.cxx).mean()) if m.p else 1.0
    scale = scale if scale > 0 and math.isfinite(scale) else 1.0
    return sorted({DEFAULT_ALPHA} | {scale * 10.0**e for e in range(-6, 2)})


def fit_group(
    train: Moments, held: Moments | None, *, heads: int, alpha: float | str = DEFAULT_ALPHA, what: str = ""
) -> dict:
    """Fit one (target layer, K/V): ``{"w", "b", "alpha", "r2" [heads] (held-out, or None)}``."""
    if alpha == "auto":
        if held is None or held.n < 1:
            raise FitError(
                f"--alpha auto needs held-out observations{' for ' + what if what else ''}, there are none",
                "give more sequences (more --tokens) or a fixed --alpha",
            )
        best = None
        for lam in alpha_grid(train):
            w, b = solve(train, lam)
            score = float(grouped_r2(w, b, held, heads).mean())
            if best is None or score > best[0] + 1e-12:
                best = (score, lam, w, b)
        _, lam, w, b = best
    else:
        lam = float(alpha)
        if lam < 0 or not math.isfinite(lam):
            raise FitError(f"--alpha must be a non-negative number or 'auto', got {alpha!r}", "use e.g. --alpha 0.01")
        w, b = solve(train, lam)
    r2 = grouped_r2(w, b, held, heads) if held is not None and held.n >= 1 else None
    return {"w": w, "b": b, "alpha": lam, "r2": r2}


def check_determined(n_obs: float, n_features: int, *, what: str, fix: str) -> None:
    """Refuse a fit with fewer observations per target head than features."""
    if n_obs < n_features:
        raise FitError(
            f"underdetermined fit for {what}: {int(n_obs)} calibration observations per target head but "
            f"{n_features} features; it would reach R²≈1 on calibration data and collapse on held-out data",
            fix,
        )


LOW_R2 = 0.5  # mean held-out R² below this: the fitter warns that the mapping is poor


def default_budget() -> int:
    """The statistics budget when none is given (:func:`kvbridge.fit.plan.default_budget`), a FitError if malformed."""
    return plan_budget(FitError)


def r2_summary(r2k: torch.Tensor | None, r2v: torch.Tensor | None, *, threshold: float = LOW_R2) -> tuple[dict, list]:
    """``(summary, warnings)`` of per (layer, head) held-out R² tables."""
    if r2k is None or r2v is None:
        return {"heldout": False}, ["no held-out observations: the fit's quality is unmeasured"]
    both = torch.stack([r2k, r2v])
    summary = {
        "heldout": True,
        "mean": float(both.mean()),
        "mean_k": float(r2k.mean()),
        "mean_v": float(r2v.mean()),
        "min": float(both.min()),
    }
    warnings = []
    if summary["mean"] < threshold:
        warnings.append(
            f"poor fit: mean held-out R² {summary['mean']:.3f} (K {summary['mean_k']:.3f}, V {summary['mean_v']:.3f}) "
            f"is below {threshold}: the source cache carries little linear information about this target's cache, "
            "so a transferred cache will not behave like the target's own (re-prefill instead, or try other models)"
        )
    else:
        bad = [int(i) for i in torch.nonzero(both.mean(dim=(0, 2)) < threshold).flatten()]  # per target layer
        if bad:
            warnings.append(f"target layers {bad} fit poorly (held-out R² < {threshold})")
    return summary, warnings


def heldout_fields(r2k: list, r2v: list, low_r2: float, measured: bool | None = None) -> dict:
    """The :class:`~kvbridge.fit.protocol.FitReport` fields of per-target-layer held-out R² tables
    (``measured``: stack them; default when none is None): ``heldout_r2``, ``r2_summary``, ``warnings``."""
    if measured is None:
        measured = all(r is not None for r in r2k + r2v)
    tk, tv = (torch.stack(r2k), torch.stack(r2v)) if measured else (None, None)
    summary, warnings = r2_summary(tk, tv, threshold=low_r2)
    r2 = {"k": tk.tolist(), "v": tv.tolist()} if measured else {"k": None, "v": None}
    return {"heldout_r2": r2, "r2_summary": summary, "warnings": tuple(warnings)}


def scores_record(scores: dict) -> dict:
    """A layer selection's scores (``mean`` / ``k`` / ``v`` tensors, ``measured_on``) as JSON values."""
    return {**{c: scores[c].tolist() for c in ("mean", "k", "v")}, "measured_on": scores["measured_on"]}


def dims(source_spec, target_spec):
    return dict(
        src_heads=source_spec.num_kv_heads,
        src_dim=source_spec.head_dim,
        tgt_heads=target_spec.num_kv_heads,
        tgt_dim=target_spec.head_dim,
    )


def device_of(calibration):
    return getattr(calibration, "device", "cpu")


def plan_blocks(n: int, bytes_of, budget: int, *, what: str) -> list[list[int]]:
    """Consecutive blocks of ``range(n)`` whose ``bytes_of(block)`` stays within ``budget``
    (the planner's rule, :func:`kvbridge.fit.plan.pack_blocks`; a FitError when one layer is over)."""
    return pack_blocks(n, bytes_of, budget, what, FitError)
