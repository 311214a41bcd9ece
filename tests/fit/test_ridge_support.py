"""The ridge fitter's per-head options: support=head-local, weighting=attention, select=kl (issue 31)."""

from __future__ import annotations

import pytest
import torch

from kvbridge.fit.ridge import FitError, RidgeFitter, RidgeOptions
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
