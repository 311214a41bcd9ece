"""Per target head statistics: each target (layer, KV head) over its own support, optionally weighted.

What ``ridge -o support=head-local`` and ``-o weighting=attention`` accumulate in their second
pass. For target head ``(t, h)`` the features are the concatenated source KV heads of its
support (a list of source ``(layer, head)`` slots, ``p = len(support) · D_s``), the targets its
``D_t`` dims; one :class:`~kvbridge.fit.stats.MomentStats` per (head, K/V, split). With
``weighted`` each observation carries the attention-repair weight of that target head
(:mod:`kvbridge.fit.repair`, shrunk per sequence so the fit keeps ``ESS >= min(n, 2p)``): the
weight differs per head, so the features' co-moments do too, which is why weighted statistics
are per head (and need the support fixed first: the selection pass).

Memory: ``Σ_heads 4 · 8 · (p² + p·D_t + 2p + 2D_t)`` bytes (:meth:`HeadStats.nbytes`).
"""

from __future__ import annotations

import torch

from kvbridge.fit.repair import shrink
from kvbridge.fit.stats import MomentStats, StatsSet, Workspace


class HeadStats(StatsSet):
    """Statistics per target (layer, head) over ``supports[(t, h)]`` (source ``(layer, head)`` slots)."""

    xx_block = "per-head"

    def __init__(
        self,
        supports: dict,
        *,
        src_heads: int,
        src_dim: int,
        tgt_heads: int,
        tgt_dim: int,
        weighted: bool = False,
        ess_fraction: float = 1.0,
        device="cpu",
    ):
        self.supports = {(int(t), int(h)): tuple((int(s), int(g)) for s, g in sup) for (t, h), sup in supports.items()}
        self.src_heads, self.src_dim, self.tgt_heads, self.tgt_dim = src_heads, src_dim, tgt_heads, tgt_dim
        self.weighted = bool(weighted)
        self.needs_attention = self.weighted  # PairedCalibration records the repair scores for this job
        self.ess_fraction = float(ess_fraction)
        self.workspace = Workspace(device)
        self.stats = {
            (t, h, c, s): MomentStats(len(sup) * src_dim, tgt_dim, device=device, workspace=self.workspace)
            for (t, h), sup in self.supports.items()
            for c in self.KINDS
            for s in self.SPLITS
        }
        self._index = {
            key: (torch.tensor([s for s, _ in sup]), torch.tensor([g for _, g in sup]))
            for key, sup in self.supports.items()
        }

    def update(self, feats: dict, held_mask: torch.Tensor | None) -> None:
        """``feats`` as :meth:`kvbridge.fit.calibrate.PairedCalibration.features` gives them (with
        ``rk``/``rv``/``seq`` when weighted)."""
        n_obs = feats["xk"].shape[0]
        held = torch.zeros(n_obs, dtype=torch.bool) if held_mask is None else held_mask.cpu()
        rows = {s: torch.nonzero(held == (s == "held")).flatten() for s in self.SPLITS}
        weights = {}
        if self.weighted:
            if "r" + self.KINDS[0] not in feats:
                raise ValueError("weighted head statistics need the attention-repair scores (rk, rv) in feats")
            seq = feats["seq"].cpu()
            for c in self.KINDS:
                r = feats["r" + c].double().cpu()  # [n, L_t, H_t], mean 1 per sequence and head
                w = torch.empty_like(r)
                for i in torch.unique(seq).tolist():
                    sel = torch.nonzero(seq == i).flatten()
                    w[sel] = shrink(r[sel].permute(1, 2, 0), self.ess_fraction).permute(2, 0, 1)
                weights[c] = w
        for (t, h), (li, hi) in self._index.items():
            for c in self.KINDS:
                x = feats["x" + c][:, li.to(feats["x" + c].device), hi.to(feats["x" + c].device)].reshape(n_obs, -1)
                y = feats["y" + c][:, t, h]
                w = weights[c][:, t, h] if self.weighted else None
                for s in self.SPLITS:  # held-out stays unweighted: its R² compares with uniform fits
                    if rows[s].numel():
                        self.stats[(t, h, c, s)].update(x, y, rows=rows[s], weights=w if s == "train" else None)

    def n(self, split: str = "train") -> float:
        return min(st.n for (_, _, c, s), st in self.stats.items() if s == split)
