"""Attention-repair weights (kvbridge.fit.repair): the scores against a direct loop, the boundaries,
the shrinkage's effective-sample-size guarantee."""

from __future__ import annotations

import torch

from kvbridge.fit.repair import boundaries, ess, normalise, repair_scores, shrink


def test_repair_scores_match_a_direct_computation():
    g = torch.Generator().manual_seed(1)
    b, hq, hkv, t, d = 2, 4, 2, 12, 8
    q_all = torch.randn(b, hq, t, d, generator=g)
    k, v = torch.randn(b, hkv, t, d, generator=g), torch.randn(b, hkv, t, d, generator=g)
    pos = boundaries(t, 5)
    rk, rv = repair_scores(q_all[:, :, pos], k, v, pos)
    ek, ev = torch.zeros(b, hkv, t), torch.zeros(b, hkv, t)
    for bi in range(b):
        for qh in range(hq):
            kv = qh // (hq // hkv)
            for u in pos:
                a = torch.softmax(q_all[bi, qh, u] @ k[bi, kv, : u + 1].T / d**0.5, -1)
                o = a @ v[bi, kv, : u + 1]
                for i in range(u):
                    ev[bi, kv, i] += a[i] ** 2
                    dist = (v[bi, kv, i] - o).square().sum()
                    ek[bi, kv, i] += a[i] ** 2 * dist * q_all[bi, qh, u].square().sum() / d
    assert torch.allclose(rv, ev, atol=1e-5) and torch.allclose(rk, ek, rtol=1e-4, atol=1e-5)


def test_boundaries_are_log_spaced_and_bounded():
    pts = boundaries(512)
    assert pts[0] == 1 and pts[-1] == 511 and len(pts) <= 32 and pts == sorted(set(pts))
    assert boundaries(1) == []


def test_shrinkage_keeps_the_effective_sample_size():
    r = normalise(torch.tensor([[100.0, 1, 1, 1, 0, 0, 0, 0, 0, 0]]))
    for f in (0.2, 0.5, 0.9):
        w = shrink(r, f)
        assert float(ess(w)) >= f * 10 - 1e-9
        assert abs(float(w.mean()) - 1.0) < 1e-12
    assert torch.equal(shrink(r, 1.0), torch.ones_like(r))
    flat = normalise(torch.full((1, 6), 3.0))  # uniform scores give uniform weights at any fraction
    assert torch.allclose(shrink(flat, 0.1), torch.ones(1, 6, dtype=torch.float64))
    assert torch.equal(normalise(torch.zeros(1, 4)), torch.ones(1, 4, dtype=torch.float64))
