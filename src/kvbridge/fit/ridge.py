"""Centred affine ridge from sufficient statistics, and held-out R² from statistics alone.

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

**Memory model** (the ``ridge`` fitter). One accumulation job over source layers ``U`` and
target layers ``B`` holds, for K and V and for the train and held-out splits, ``8 bytes ×
(p² + p·q + 2p + 2q)`` with ``p = |U|·H_s·D_s`` and ``q = |B|·H_t·D_t``; nothing grows with the
number of tokens. When the joint job (all source layers × all target layers) fits in
``memory_budget`` (default 8 GiB, ``$KVBRIDGE_FIT_MEMORY`` in GiB) one pass over the corpus
gives both the layer selection and the final fit. Otherwise the fit takes more passes:
selection passes keep only the per-source-layer diagonal blocks of ``Cxx`` (``p·H_s·D_s``) for
as many target layers as fit, then fit passes accumulate the joint statistics of each block
of target layers over the union of the source layers they selected, the blocks sized to the
budget. Each pass re-runs both models over the corpus: memory is traded for forward passes.

``alpha="auto"`` picks λ per (target layer, K/V) on the held-out statistics from
:func:`alpha_grid`: 0.01 and ``s · 10^e`` for ``e`` in -6..1, ``s`` the mean diagonal of
``Cxx`` (so the grid follows the features' scale).
"""

from __future__ import annotations

import math

import torch

from kvbridge.errors import KVBridgeError
from kvbridge.fit.stats import DTYPE, Moments

DEFAULT_ALPHA = 0.01


class FitError(KVBridgeError):
    """A fit that cannot be made (underdetermined, singular, no held-out data)."""


def solve(m: Moments, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W [p, q], b [q])`` of the centred ridge on statistics ``m``."""
    a = m.cxx.to(DTYPE, copy=True)
    a.diagonal().add_(float(alpha))
    chol, info = torch.linalg.cholesky_ex(a)
    if int(info) != 0:  # not positive definite (alpha 0 on collinear features): least-squares fallback
        w = torch.linalg.lstsq(a, m.cxy.to(DTYPE)).solution
    elif m.q >= m.p:  # many right-hand sides: the explicit SPD inverse and one GEMM beat two TRSMs
        w = torch.cholesky_inverse(chol) @ m.cxy.to(DTYPE)
    else:
        w = torch.cholesky_solve(m.cxy.to(DTYPE), chol)
    b = m.mean_y - m.mean_x @ w
    return w, b


def sse(w: torch.Tensor, b: torch.Tensor, held: Moments) -> torch.Tensor:
    """Per output dim squared error of ``x W + b`` on the held-out statistics ``held``."""
    cw = held.cxx @ w
    quad = (w * cw).sum(0)
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
    grid = {DEFAULT_ALPHA} | {scale * 10.0 ** e for e in range(-6, 2)}
    return sorted(grid)


def fit_group(train: Moments, held: Moments | None, *, heads: int, alpha: float | str = DEFAULT_ALPHA,
              what: str = "") -> dict:
    """Fit one (target layer, K/V): ``{"w", "b", "alpha", "r2" [heads] (held-out, or None)}``."""
    if alpha == "auto":
        if held is None or held.n < 1:
            raise FitError(f"--alpha auto needs held-out observations{' for ' + what if what else ''}, there are none",
                           "give more sequences (more --tokens) or a fixed --alpha")
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
            fix)


LOW_R2 = 0.5  # mean held-out R² below this: the fitter warns that the mapping is poor


def default_budget() -> int:
    import os

    raw = os.environ.get("KVBRIDGE_FIT_MEMORY")
    try:
        return int(float(raw) * 2**30) if raw else 8 * 2**30
    except ValueError:
        raise FitError(f"KVBRIDGE_FIT_MEMORY={raw!r} is not a number of GiB", "set e.g. KVBRIDGE_FIT_MEMORY=8") from None


def r2_summary(r2k: torch.Tensor | None, r2v: torch.Tensor | None, *, threshold: float = LOW_R2) -> tuple[dict, list]:
    """``(summary, warnings)`` of per (layer, head) held-out R² tables."""
    if r2k is None or r2v is None:
        return {"heldout": False}, ["no held-out observations: the fit's quality is unmeasured"]
    both = torch.stack([r2k, r2v])
    summary = {"heldout": True, "mean": float(both.mean()), "mean_k": float(r2k.mean()),
               "mean_v": float(r2v.mean()), "min": float(both.min())}
    warnings = []
    if summary["mean"] < threshold:
        warnings.append(
            f"poor fit: mean held-out R² {summary['mean']:.3f} (K {summary['mean_k']:.3f}, V {summary['mean_v']:.3f}) "
            f"is below {threshold}: the source cache carries little linear information about this target's cache, "
            "so a transferred cache will not behave like the target's own (re-prefill instead, or try other models)")
    else:
        per_layer = both.mean(dim=(0, 2))
        bad = [int(i) for i in torch.nonzero(per_layer < threshold).flatten()]
        if bad:
            warnings.append(f"target layers {bad} fit poorly (held-out R² < {threshold})")
    return summary, warnings


def _dims(source_spec, target_spec):
    return dict(src_heads=source_spec.num_kv_heads, src_dim=source_spec.head_dim,
                tgt_heads=target_spec.num_kv_heads, tgt_dim=target_spec.head_dim)


def _device(calibration):
    return getattr(calibration, "device", "cpu")


def plan_blocks(n: int, bytes_of, budget: int, *, what: str) -> list[list[int]]:
    """Consecutive blocks of ``range(n)`` whose ``bytes_of(block)`` stays within ``budget``."""
    blocks, cur = [], []
    for i in range(n):
        if cur and bytes_of(cur + [i]) > budget:
            blocks.append(cur)
            cur = []
        cur.append(i)
        if bytes_of(cur) > budget:
            raise FitError(f"{what} needs {bytes_of(cur) / 2**30:.2f} GiB of statistics for one target layer, over the "
                           f"{budget / 2**30:.2f} GiB budget", "raise KVBRIDGE_FIT_MEMORY, lower --top-k or use "
                           "--fitter ridge-headwise")
    if cur:
        blocks.append(cur)
    return blocks


class RidgeFitter:
    """``ridge``: centred affine ridge per target (layer, KV head) on the top-k source layers."""

    name = "ridge"

    def fit(self, source_spec, target_spec, calibration=None, *, top_k: int = 4, alpha=DEFAULT_ALPHA,
            memory_budget: int | None = None, low_r2: float = LOW_R2, **_):
        from kvbridge.fit.mapping import FittedMapping, LayerMap
        from kvbridge.fit.select import single_layer_r2, top_k as pick
        from kvbridge.fit.stats import LayerStats

        if calibration is None:
            raise FitError("the ridge fitter needs calibration data", "pass a corpus (kvbridge fit --corpus)")
        dims = _dims(source_spec, target_spec)
        ls, lt = source_spec.num_layers, target_spec.num_layers
        if int(top_k) < 1:
            raise FitError(f"--top-k must be >= 1, got {top_k}", "use e.g. --top-k 4")
        k = min(int(top_k), ls)
        fs = dims["src_heads"] * dims["src_dim"]
        n_train = calibration.observations("train")
        check_determined(n_train, k * fs, what=f"top-k {k} source layers x {dims['src_heads']} KV heads x "
                                                f"{dims['src_dim']} dims",
                         fix=f"give at least {k * fs} training observations (more --tokens, or a smaller --stride), "
                             f"a smaller --top-k, or --fitter ridge-headwise ({dims['src_dim']} features per head)")
        budget = default_budget() if memory_budget is None else int(memory_budget)
        passes, results = [], {}
        full = LayerStats.nbytes_for(ls, lt, **dims, xx_block="full")
        if full <= budget:  # one pass: selection and fit from the joint statistics
            job = LayerStats(range(ls), range(lt), **dims, xx_block="full", device=_device(calibration))
            calibration.accumulate([job], tag="joint")
            passes.append({"tag": "joint", "bytes": job.nbytes()})
            scores = single_layer_r2(job)
            selection = pick(scores["mean"], job.src_layers, k)
            n_seen = job.n("train")
            self._check_seen(n_seen, k, fs, dims)
            results = self._solve_layers(job, range(lt), selection, alpha, dims)
        else:  # blocked: selection passes, then fit passes over blocks of target layers
            rows = {"mean": [None] * lt, "k": [None] * lt, "v": [None] * lt}
            sel_blocks = plan_blocks(lt, lambda b: LayerStats.nbytes_for(ls, len(b), **dims, xx_block="layer"),
                                     budget, what="layer selection")
            for bi, block in enumerate(sel_blocks):
                job = LayerStats(range(ls), block, **dims, xx_block="layer", device=_device(calibration))
                calibration.accumulate([job], tag=f"select{bi}")
                passes.append({"tag": f"select{bi}", "bytes": job.nbytes(), "target_layers": list(block)})
                sc = single_layer_r2(job)
                for j, t in enumerate(block):
                    for key in rows:
                        rows[key][t] = sc[key][j]
                measured = sc["measured_on"]
                n_seen = job.n("train")
                del job
            self._check_seen(n_seen, k, fs, dims)
            scores = {key: torch.stack(v) for key, v in rows.items()}
            scores["measured_on"] = measured
            selection = pick(scores["mean"], range(ls), k)

            def union(b):
                return sorted({s for t in b for s in selection[t]})

            fit_blocks = plan_blocks(lt, lambda b: LayerStats.nbytes_for(len(union(b)), len(b), **dims), budget,
                                     what="the joint fit")
            for bi, block in enumerate(fit_blocks):
                job = LayerStats(union(block), block, **dims, xx_block="full", device=_device(calibration))
                calibration.accumulate([job], tag=f"fit{bi}")
                passes.append({"tag": f"fit{bi}", "bytes": job.nbytes(), "target_layers": list(block)})
                results.update(self._solve_layers(job, block, selection, alpha, dims))
                del job
        n_train_seen = n_seen
        layers, r2k, r2v, alphas = [], [], [], []
        for t in range(lt):
            res = results[t]
            layers.append(LayerMap("dense", tuple(selection[t]), res["k"]["w"].float(), res["k"]["b"].float(),
                                   res["v"]["w"].float(), res["v"]["b"].float()))
            r2k.append(res["k"]["r2"])
            r2v.append(res["v"]["r2"])
            alphas.append([res["k"]["alpha"], res["v"]["alpha"]])
        has_r2 = all(r is not None for r in r2k + r2v)
        tk = torch.stack(r2k) if has_r2 else None
        tv = torch.stack(r2v) if has_r2 else None
        summary, warnings = r2_summary(tk, tv, threshold=low_r2)
        report = {
            "fitter": self.name,
            "params": {"top_k": k, "alpha": alpha, "memory_budget": budget},
            "layer_selection": [list(s) for s in selection],
            "selection_scores": {"mean": scores["mean"].tolist(), "k": scores["k"].tolist(), "v": scores["v"].tolist(),
                                 "measured_on": scores["measured_on"]},
            "heldout_r2": {"k": tk.tolist() if tk is not None else None, "v": tv.tolist() if tv is not None else None},
            "r2_summary": summary,
            "alpha_chosen": alphas,
            "observations": {"train": int(n_train_seen), "features_per_head": k * fs},
            "passes": passes,
            "warnings": warnings,
        }
        return FittedMapping(source_spec, target_spec, layers, fitter=self.name, report=report)

    @staticmethod
    def _check_seen(n_seen, k, fs, dims) -> None:
        check_determined(n_seen, k * fs, what=f"top-k {k} source layers x {dims['src_heads']} KV heads x "
                                               f"{dims['src_dim']} dims",
                         fix="give more --tokens, a smaller --stride or --top-k, or --fitter ridge-headwise")

    @staticmethod
    def _solve_layers(job, block, selection, alpha, dims) -> dict:
        out = {}
        held_ok = job.n("held") >= 1
        for t in block:
            res = {}
            for kind in ("k", "v"):
                train = job.moments(kind, "train", src_layers=selection[t], tgt_layers=[t])
                held = job.moments(kind, "held", src_layers=selection[t], tgt_layers=[t]) if held_ok else None
                res[kind] = fit_group(train, held, heads=dims["tgt_heads"], alpha=alpha,
                                      what=f"target layer {t} {kind.upper()}")
            out[t] = res
        return out


__all__ = ["RidgeFitter", "r2_summary", "plan_blocks", "default_budget", "LOW_R2", "solve", "sse", "grouped_r2", "alpha_grid", "fit_group", "check_determined", "FitError",
           "DEFAULT_ALPHA"]
