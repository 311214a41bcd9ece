"""Attention-repair observation weights (``ridge -o weighting=attention``).

A cached position matters to the target as much as later queries read it. During the target's
calibration forward the queries of ``BOUNDARIES`` (about 32) log-spaced positions ``u`` per
sequence are taken (each the first query after a prefix ``[0, u)``), with the target's own
softmax attention ``a_ui`` over the cached positions ``i < u``, per query head, and the attention
output ``o_u = Σ_i a_ui v_i``. Per target (layer, KV head) and cached position ``i``, summed over
the boundaries after ``i`` and the query heads that read the KV head (GQA)::

    r_V[i] = Σ_u a_ui²
    r_K[i] = Σ_u a_ui² · ||v_i - o_u||² · ||q_u||² / d

(the first-order change of the attention output when ``v_i``, resp. ``k_i``, is perturbed:
CacheBridge's attention repair). Per sequence the weights of the sampled positions are
normalised to mean 1 (a sequence whose weights are all 0 keeps uniform weights) and then shrunk
toward uniform, ``w = (1 - β) r̃ + β``, with the smallest ``β`` that keeps the effective sample
size ``(Σw)² / Σw²`` at least ``fraction`` of the sequence's observations (closed form below);
with ``fraction = min(1, 2p / n)`` the whole fit keeps ``ESS >= min(n, 2p)`` (p features, n
observations), because every sequence's weights have mean 1.

Memory: only the per-layer weights ``[B, H_kv, T]`` are kept; the queries and attention of one
layer live for the duration of that layer's hook (``[B, H_q, 32, T]`` scores); the bound is
:func:`kvbridge.fit.plan.attention_record_bytes`, which ``kvbridge fit --plan`` states.
"""

from __future__ import annotations

import math

import torch

#: log-spaced query boundaries per calibration sequence
BOUNDARIES = 32


def boundaries(seq_len: int, count: int = BOUNDARIES) -> list[int]:
    """Up to ``count`` distinct log-spaced query positions in ``[1, seq_len - 1]``."""
    if seq_len < 2:
        return []
    hi = seq_len - 1
    pts = {int(round(math.exp(math.log(hi) * j / max(1, count - 1)))) for j in range(count)}
    return sorted(p for p in pts if 1 <= p <= hi)


def repair_scores(q, k, v, positions, *, scaling=None, softcap=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r_K, r_V)``, each ``[B, H_kv, T]`` float32, from one layer's attention.

    ``q [B, H_q, U, D]``: the queries at ``positions`` (``U`` ints, the boundaries); ``k``, ``v``
    ``[B, H_kv, T, D]`` the layer's (post-RoPE) keys and values as the attention reads them.
    """
    q, k, v = q.float(), k.float(), v.float()
    b, hq, u, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    g = hq // hkv
    scaling = d**-0.5 if scaling is None else scaling
    kk = k.repeat_interleave(g, dim=1) if g > 1 else k
    vv = v.repeat_interleave(g, dim=1) if g > 1 else v
    scores = torch.matmul(q, kk.transpose(-1, -2)) * scaling  # [B, Hq, U, T]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    pos = torch.as_tensor(positions, device=q.device).view(u, 1)
    cols = torch.arange(t, device=q.device).view(1, t)
    scores = scores.masked_fill(cols > pos, float("-inf"))  # the query at u reads 0..u (causal)
    a = torch.softmax(scores, dim=-1)
    out = torch.matmul(a, vv)  # [B, Hq, U, D]
    a2 = a.masked_fill(cols >= pos, 0.0).square()  # only the cached positions i < u are repaired
    r_v = a2.sum(dim=2)  # [B, Hq, T]
    # ||v_i - o_u||² = ||v_i||² - 2 v_i·o_u + ||o_u||²
    vn = vv.square().sum(-1)  # [B, Hq, T]
    cross = torch.matmul(out, vv.transpose(-1, -2))  # [B, Hq, U, T]
    dist = (vn[:, :, None, :] - 2 * cross + out.square().sum(-1)[..., None]).clamp(min=0.0)
    qn = q.square().sum(-1)[..., None] / d  # [B, Hq, U, 1]
    r_k = (a2 * dist * qn).sum(dim=2)
    return r_k.view(b, hkv, g, t).sum(2), r_v.view(b, hkv, g, t).sum(2)


def normalise(r: torch.Tensor) -> torch.Tensor:
    """``r [..., n]`` scaled to mean 1 along the last dim (all-zero rows: uniform 1)."""
    r = r.double().clamp(min=0.0)
    m = r.mean(-1, keepdim=True)
    return torch.where(m > 0, r / m.clamp(min=1e-300), torch.ones_like(r))


def shrink(r: torch.Tensor, fraction: float) -> torch.Tensor:
    """Weights of mean 1 along the last dim with ``ESS >= fraction · n`` (``r`` has mean 1).

    With ``w = (1 - β) r + β`` and ``v`` the (population) variance of ``r``:
    ``ESS / n = 1 / (1 + (1 - β)² v)``, so ``β = max(0, 1 - sqrt((1/f - 1) / v))``.
    """
    f = min(1.0, max(float(fraction), 1e-12))
    if f >= 1.0:
        return torch.ones_like(r)
    var = r.var(dim=-1, unbiased=False, keepdim=True)
    keep = torch.sqrt((1.0 / f - 1.0) / var.clamp(min=1e-300)).clamp(max=1.0)  # 1 - β
    return keep * r + (1.0 - keep)


def ess(w: torch.Tensor) -> torch.Tensor:
    """Effective sample size ``(Σw)² / Σw²`` along the last dim."""
    w = w.double()
    return w.sum(-1).square() / w.square().sum(-1).clamp(min=1e-300)
