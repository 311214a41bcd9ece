"""Source-layer selection: top-k source layers per target layer by single-layer R².

For every (target layer t, source layer s) a ridge is fitted from *only* source layer s (all
its KV heads) to each KV head of t, separately for K and V, on the calibration statistics;
the score is its R² averaged over the heads of t and over K and V. The k best source layers
(highest score first) become the features of t's final fit. R² is measured on the held-out
statistics when there are any (a fairer ranking when layers are near-collinear), else on the
training statistics.

Cost: one Cholesky factor per (source layer, K/V) serves every target layer at once.
"""

from __future__ import annotations

import torch

from kvbridge.fit.solve import DEFAULT_ALPHA, grouped_r2, solve


def single_layer_r2(job, *, alpha: float = DEFAULT_ALPHA, tgt_layers=None) -> dict:
    """``{"k": [T, S], "v": [T, S], "mean": [T, S]}`` head-averaged R² (rows: ``tgt_layers``).

    ``job`` is a :class:`~kvbridge.fit.stats.LayerStats` with ``full`` or ``layer`` blocks.
    """
    tgt = list(job.tgt_layers if tgt_layers is None else tgt_layers)
    held_split = "held" if job.n("held") >= 1 else "train"
    out = {}
    for kind in ("k", "v"):
        r2 = torch.zeros(len(tgt), len(job.src_layers), dtype=torch.float64)
        for j, s in enumerate(job.src_layers):
            train = job.moments(kind, "train", src_layers=[s], tgt_layers=tgt)
            held = job.moments(kind, held_split, src_layers=[s], tgt_layers=tgt)
            lam = alpha if isinstance(alpha, (int, float)) else DEFAULT_ALPHA
            w, b = solve(train, lam)
            r2[:, j] = grouped_r2(w, b, held, len(tgt) * job.tgt_heads).view(len(tgt), job.tgt_heads).mean(1)
        out[kind] = r2
    out["mean"] = (out["k"] + out["v"]) / 2
    out["measured_on"] = held_split
    return out


def single_head_r2(job, tgt_layers, *, alpha: float = DEFAULT_ALPHA) -> dict:
    """``{"k", "v", "mean": [len(tgt_layers), H_t, S·H_s]}``: the held-out R² (training R² when
    there is no held-out split) of a ridge from one source (layer, head) to each target head, the
    last axis ``source layer index in job.src_layers · H_s + source head``; ``"measured_on"``."""
    tgt = list(tgt_layers)
    hs, ht = job.src_heads, job.tgt_heads
    held_split = "held" if job.n("held") >= 1 else "train"
    out = {}
    for c in ("k", "v"):
        sc = torch.zeros(len(tgt), ht, len(job.src_layers) * hs, dtype=torch.float64)
        for j, s in enumerate(job.src_layers):
            for h in range(hs):
                tr = job.moments(c, "train", src_head=(s, h), tgt_layers=tgt)
                he = job.moments(c, held_split, src_head=(s, h), tgt_layers=tgt)
                w, b = solve(tr, alpha)
                sc[:, :, j * hs + h] = grouped_r2(w, b, he, len(tgt) * ht).view(len(tgt), ht)
        out[c] = sc
    out["mean"] = (out["k"] + out["v"]) / 2
    out["measured_on"] = held_split
    return out


def top_k(scores: torch.Tensor, src_layers, k: int) -> list[list[int]]:
    """Per row of ``scores [T, S]``: the ``k`` best source layers, best first."""
    k = min(int(k), scores.shape[1])
    order = torch.argsort(scores, dim=1, descending=True, stable=True)[:, :k]
    src = list(src_layers)
    return [[src[int(j)] for j in row] for row in order]


__all__ = ["single_layer_r2", "single_head_r2", "top_k"]
