"""Source-layer selection: top-k source layers per target layer by single-layer R².

For every (target layer t, source layer s) a ridge is fitted from *only* source layer s (all
its KV heads) to each KV head of t, separately for K and V, on the calibration statistics;
the score is its R² averaged over the heads of t and over K and V. The k best source layers
(highest score first) become the features of t's final fit. R² is measured on the held-out
statistics when there are any (a fairer ranking when layers are near-collinear), else on the
training statistics (then from the closed form of :func:`train_r2`, no second GEMM).

Cost: one Cholesky factor per (source layer, K/V) serves every target layer at once.
"""

from __future__ import annotations

import torch

from kvbridge.fit.solve import DEFAULT_ALPHA, grouped_r2, solve, solve_w
from kvbridge.fit.stats import Moments


def _r2_table(job, tgt: list, groups: list, alpha, per_group) -> dict:
    """``{"k", "v", "mean"}``: for each source group (``job.moments`` selectors, one column each) the
    R² of a ridge from it to each target head of ``tgt`` (``[len(tgt), H_t]``, reduced by
    ``per_group``), on the held-out statistics (training ones when there are none); ``"measured_on"``."""
    held_split = "held" if job.n("held") >= 1 else "train"
    # training R² from the normal equations (below)
    closed = held_split == "train" and isinstance(alpha, (int, float)) and alpha > 0
    n_groups = len(tgt) * job.tgt_heads
    out = {}
    for kind in ("k", "v"):
        cols = []
        for sel in groups:
            train = job.moments(kind, "train", tgt_layers=tgt, **sel)
            if closed:  # no intercept needed: the training residual's mean is 0
                r2 = train_r2(solve_w(train, alpha), train, alpha, n_groups)
            else:
                w, b = solve(train, alpha)
                r2 = grouped_r2(w, b, job.moments(kind, held_split, tgt_layers=tgt, **sel), n_groups)
            cols.append(per_group(r2.view(len(tgt), job.tgt_heads)))
        out[kind] = torch.stack(cols, -1).to(torch.float64)
    return {**out, "mean": (out["k"] + out["v"]) / 2, "measured_on": held_split}


def train_r2(w: torch.Tensor, train: Moments, alpha: float, groups: int) -> torch.Tensor:
    """R² per group of ``q / groups`` output dims of the ridge ``w`` ON ITS OWN training statistics.

    ``w`` solves ``(Cxx + λI) W = Cxy`` (``λ > 0``) and ``b = ȳ - x̄ᵀW`` leaves no mean residual,
    so ``Cxx W = Cxy - λW`` and the SSE ``cyy - 2 Σ W⊙Cxy + Σ W⊙(Cxx W)`` is
    ``cyy - Σ W⊙Cxy - λ Σ W²``: exact algebra, without :func:`grouped_r2`'s second GEMM.
    """
    e = (train.cyy - (w * train.cxy).sum(0) - float(alpha) * (w * w).sum(0)).clamp(min=0.0)
    e = e.reshape(groups, -1).sum(1)
    t = train.cyy.reshape(groups, -1).sum(1)
    return torch.where(t > 0, 1.0 - e / t.clamp(min=1e-300), torch.zeros_like(t))


def single_layer_r2(job, *, alpha: float = DEFAULT_ALPHA, tgt_layers=None) -> dict:
    """``{"k": [T, S], "v": [T, S], "mean": [T, S]}`` head-averaged R² (rows: ``tgt_layers``).

    ``job`` is a :class:`~kvbridge.fit.stats.LayerStats` with ``full`` or ``layer`` blocks.
    """
    tgt = list(job.tgt_layers if tgt_layers is None else tgt_layers)
    lam = alpha if isinstance(alpha, (int, float)) else DEFAULT_ALPHA
    return _r2_table(job, tgt, [{"src_layers": [s]} for s in job.src_layers], lam, lambda r2: r2.mean(1))


def single_head_r2(job, tgt_layers, *, alpha: float = DEFAULT_ALPHA) -> dict:
    """``{"k", "v", "mean": [len(tgt_layers), H_t, S·H_s]}``: the held-out R² (training R² when
    there is no held-out split) of a ridge from one source (layer, head) to each target head, the
    last axis ``source layer index in job.src_layers · H_s + source head``; ``"measured_on"``."""
    groups = [{"src_head": (s, h)} for s in job.src_layers for h in range(job.src_heads)]
    return _r2_table(job, list(tgt_layers), groups, alpha, lambda r2: r2)


def top_k(scores: torch.Tensor, src_layers, k: int) -> list[list[int]]:
    """Per row of ``scores [T, S]``: the ``k`` best source layers, best first."""
    order = torch.argsort(scores, dim=1, descending=True, stable=True)[:, : int(k)]  # at most every column
    src = list(src_layers)
    return [[src[int(j)] for j in row] for row in order]
