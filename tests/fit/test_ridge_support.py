"""The ridge fitter's per-head options: support=head-local, weighting=attention, select=kl (issue 31)."""

from __future__ import annotations

import pytest
import torch

from kvbridge.fit.repair import boundaries, ess, normalise, repair_scores, shrink
from kvbridge.fit.ridge import FitError, RidgeFitter, RidgeOptions
from kvbridge.fit.stats import MomentStats
from kvbridge.testing import FitterContract
from kvbridge.testing.fitter_contract import fit_planted, planted_fixture


class TestHeadLocalContract(FitterContract):
    fitter = RidgeFitter
    options = {"top_k": 1, "support": "head-local"}


class TestAttentionWeightedContract(FitterContract):
    fitter = RidgeFitter
    options = {"top_k": 1, "support": "head-local", "weighting": "attention"}


class TestSelectKlContract(FitterContract):
    fitter = RidgeFitter
    options = {"top_k": 2, "select": "kl", "select_suffix": 8}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"support": "heads"}, "support='heads' is not one of layers, head-local"),
        ({"weighting": "q"}, "weighting='q' is not one of uniform, attention"),
        ({"select": "nll"}, "select='nll' is not one of r2, kl"),
        ({"select_prefix": 1.0}, "select_prefix must be in"),
    ],
)
def test_bad_options_are_one_line_errors(kwargs, match):
    with pytest.raises(FitError, match=match) as err:
        RidgeOptions(**kwargs)
    assert "\n" not in str(err.value)


def test_head_local_reads_the_planted_source_head():
    fx = planted_fixture((1, 3), 2, 40)
    mapping, _ = fit_planted(RidgeFitter, {"top_k": 1, "support": "head-local"}, fx)
    support = mapping.report.params["head_support"]
    for t, layer_heads in enumerate(support):
        for h, slots in enumerate(layer_heads):
            assert len(slots) == 1
            s, g = slots[0]
            assert s == fx["truth"][t], (t, h, slots)  # the planted source layer
            assert g == h // 2  # kv_dup=2: target heads 2g, 2g+1 are copies of source head g
    assert mapping.report.observations["features_per_head"] == fx["source"].config.head_dim
    assert mapping.report.r2_summary["mean"] > 0.999


def test_weighted_moments_match_repeated_rows_and_constant_weights_change_nothing():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(50, 6, generator=g), torch.randn(50, 3, generator=g)
    w = torch.randint(0, 4, (50,), generator=g).double()
    weighted = MomentStats(6, 3).update(x, y, weights=w)
    rep = torch.repeat_interleave(torch.arange(50), w.long())
    repeated = MomentStats(6, 3).update(x[rep], y[rep])
    for name in ("n", "mean_x", "mean_y", "cxx", "cxy", "cyy"):
        a, b = getattr(weighted, name), getattr(repeated, name)
        assert torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=1e-9), name
    ones = MomentStats(6, 3).update(x, y, weights=torch.ones(50))
    plain = MomentStats(6, 3).update(x, y)
    assert torch.allclose(ones.cxx, plain.cxx) and torch.allclose(ones.cxy, plain.cxy)


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


def test_attention_weights_at_full_ess_equal_the_uniform_fit(monkeypatch):
    """With the shrinkage forced to uniform (ESS fraction 1) the weighted pass gives the uniform fit."""
    import kvbridge.fit.headstats as hs

    fx = planted_fixture((1, 3), 2, 40)
    uni, _ = fit_planted(RidgeFitter, {"top_k": 1, "support": "head-local"}, fx)
    orig = hs.HeadStats.__init__

    def init(self, *a, **kw):
        kw["ess_fraction"] = 1.0
        orig(self, *a, **kw)

    monkeypatch.setattr(hs.HeadStats, "__init__", init)
    att, _ = fit_planted(RidgeFitter, {"top_k": 1, "support": "head-local", "weighting": "attention"}, fx)
    assert any(p.get("weighted") for p in att.report.passes)
    for a, b in zip(uni.layers, att.layers):
        assert torch.allclose(a.wk, b.wk, atol=1e-4) and torch.allclose(a.wv, b.wv, atol=1e-4)


def test_select_kl_picks_a_candidate_and_records_every_value():
    fx = planted_fixture((1, 3), 2, 40)
    mapping, _ = fit_planted(RidgeFitter, {"top_k": 2, "select": "kl", "select_suffix": 8}, fx)
    sel = mapping.report.params["selection"]
    assert sel["criterion"] == "suffix_kl"
    values = [c["suffix_kl"] for c in sel["candidates"]]
    assert len(values) == 2 * 2 * 2  # support x k in (1, 2) x alpha in (0.01, auto)
    best = min(sel["candidates"], key=lambda c: c["suffix_kl"])
    assert sel["chosen"] == {"support": best["support"], "top_k": best["top_k"], "alpha": best["alpha"]}
    assert mapping.report.params["support"] == best["support"]
    assert all(v >= -1e-6 for v in values)


def test_per_head_options_refuse_kept_statistics(tmp_path):
    fx = planted_fixture((1, 3), 2, 40)
    from kvbridge.fit.ridge import RidgeStatistics

    stats = RidgeStatistics(None, None, {}, [], 1)
    with pytest.raises(FitError, match="kept statistics solve"):
        RidgeFitter().solve(stats, RidgeOptions(support="head-local"))
    assert fx["truth"]


def test_plan_states_the_attention_recording_and_the_weighted_pass():
    from kvbridge.fit.plan import attention_record_bytes, plan

    plain = plan("zoo:base", "zoo:wide", tokens=4096, seq_len=256)
    weighted = plan("zoo:base", "zoo:wide", tokens=4096, seq_len=256, support="head-local", weighting="attention")
    assert len(weighted.passes) == len(plain.passes) + 1 and weighted.passes[-1].tag == "heads-weighted"
    rec = attention_record_bytes(4, 256, q_heads=6, kv_heads=2, head_dim=32, layers=6)
    assert weighted.batch_buffer_bytes == plain.batch_buffer_bytes + rec
    assert any("recording the target's boundary queries" in n for n in weighted.notes)
