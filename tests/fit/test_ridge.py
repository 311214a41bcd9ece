"""The ridge solver against scikit-learn, held-out R² from statistics, --alpha auto, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

from kvbridge.errors import ConfigError
from kvbridge.fit.calibrate import CalibrationConfig, PairedCalibration
from kvbridge.fit.ridge import FitError, fit_group, grouped_r2, solve
from kvbridge.fit.stats import MomentStats


@pytest.fixture(scope="module")
def features(planted, fit_host):
    """Materialised content K/V features of the planted pair (train + held-out mask)."""
    cal = PairedCalibration(
        planted["source"], planted["target"], planted["ids"][:16], CalibrationConfig(stride=2), host=fit_host
    )
    return cal.sample()


def test_ridge_equals_sklearn_ridge_on_the_same_features(features):
    feats, held = features
    x = feats["xk"][:, [1, 2]].reshape(len(held), -1).double()  # two source layers, all heads: 64 features
    y = feats["yk"][:, 3].reshape(len(held), -1).double()
    for alpha in (0.01, 3.0):
        stats = MomentStats(x.shape[1], y.shape[1])
        for i in range(0, len(x), 100):
            stats.update(x[i : i + 100], y[i : i + 100])
        w, b = solve(stats.moments(), alpha)
        ref = Ridge(alpha=alpha).fit(x.numpy(), y.numpy())
        assert np.abs(w.numpy() - ref.coef_.T).max() <= 1e-4 * max(1.0, np.abs(ref.coef_).max())
        assert np.abs(b.numpy() - ref.intercept_).max() <= 1e-4 * max(1.0, np.abs(ref.intercept_).max())


def test_heldout_r2_from_statistics_equals_predictions(features):
    feats, held = features
    x = feats["xv"][:, [0]].reshape(len(held), -1).double()  # a deliberately imperfect source layer
    y = feats["yv"][:, 4].reshape(len(held), -1).double()
    tr = MomentStats(x.shape[1], y.shape[1]).update(x[~held], y[~held])
    he = MomentStats(x.shape[1], y.shape[1]).update(x[held], y[held])
    w, b = solve(tr.moments(), 0.01)
    r2 = grouped_r2(w, b, he.moments(), groups=4)
    pred = x[held] @ w + b
    err = ((y[held] - pred) ** 2).view(-1, 4, 16).sum((0, 2))
    tot = ((y[held] - y[held].mean(0)) ** 2).view(-1, 4, 16).sum((0, 2))
    assert torch.allclose(r2, 1 - err / tot, atol=1e-9)
    assert float(r2.mean()) < 0.9  # layer 0 does not determine target layer 4


def test_alpha_auto_picks_a_stronger_ridge_on_noisy_data():
    g = torch.Generator().manual_seed(0)
    n, p = 120, 80  # few observations per feature: 0.01 overfits
    x = torch.randn(2 * n, p, generator=g, dtype=torch.float64)
    y = x[:, :4] @ torch.randn(4, 8, generator=g, dtype=torch.float64) + 2 * torch.randn(
        2 * n, 8, generator=g, dtype=torch.float64
    )
    tr = MomentStats(p, 8).update(x[:n], y[:n]).moments()
    he = MomentStats(p, 8).update(x[n:], y[n:]).moments()
    fixed = fit_group(tr, he, heads=2, alpha=0.01)
    auto = fit_group(tr, he, heads=2, alpha="auto")
    assert auto["alpha"] > 1.0
    assert float(auto["r2"].mean()) > float(fixed["r2"].mean()) + 0.05
    with pytest.raises(FitError, match="held-out"):
        fit_group(tr, None, heads=2, alpha="auto")


def test_sklearn_fitter_agrees_with_ridge_fitter(planted, planted_fit, fit_host):
    from kvbridge.fit import fit

    sk = fit(
        planted["source"],
        planted["target"],
        planted["ids"],
        fitter="sklearn",
        top_k=2,
        stride=2,
        host=fit_host,
        distributed=None,
        max_samples=None,
    )
    assert sk.layer_selection() == planted_fit.layer_selection()
    for a, b in zip(sk.layers, planted_fit.layers):
        for name in ("wk", "bk", "wv", "bv"):
            ta, tb = getattr(a, name), getattr(b, name)
            assert float((ta - tb).abs().max()) <= 1e-4 * max(1.0, float(tb.abs().max())), name
    r2_sk, r2_ridge = np.array(sk.report.heldout_r2["k"]), np.array(planted_fit.report.heldout_r2["k"])
    assert np.abs(r2_sk - r2_ridge).max() < 1e-4


def test_sklearn_fitter_refuses_nonlinear_estimators(planted, fit_host):
    from kvbridge.fit import fit

    with pytest.raises(FitError, match="coef_"):
        fit(
            planted["source"],
            planted["target"],
            planted["ids"][:8],
            fitter="sklearn",
            top_k=1,
            stride=2,
            host=fit_host,
            distributed=None,
            estimator="sklearn.neighbors:KNeighborsRegressor",
            estimator_options={},
        )
    with pytest.raises(FitError, match="JSON"):
        fit(
            planted["source"],
            planted["target"],
            planted["ids"][:8],
            fitter="sklearn",
            top_k=1,
            host=fit_host,
            distributed=None,
            estimator="sklearn.linear_model:Ridge",
            estimator_options="{alpha: 1",
        )


def test_underdetermined_fits_are_refused_with_the_numbers(planted, fit_host):
    from kvbridge.fit import fit

    ids = planted["ids"][:4]  # 3 train sequences x 12 positions (stride 4) = 36 observations
    with pytest.raises(FitError) as err:
        fit(planted["source"], planted["target"], ids, top_k=4, host=fit_host, distributed=None)
    msg = str(err.value)
    assert "underdetermined" in msg and "36 calibration observations" in msg and "128 features" in msg
    assert "--tokens" in msg and "--top-k" in msg and "ridge-headwise" in msg
    headwise = fit(
        planted["source"], planted["target"], ids, fitter="ridge-headwise", host=fit_host, distributed=None
    )  # 16 features per head: determined
    assert headwise.mode == "headwise"


def test_without_a_held_out_split_the_budget_counts_one_split(planted, fit_host):
    """--heldout 0: the held-out statistics stay empty, so the blocking rule counts the train split only:
    a budget the two-split joint job is over (and that blocked the fit) now runs it in one pass."""
    from kvbridge.fit import fit
    from kvbridge.fit.ridge import RidgeOptions
    from kvbridge.fit.stats import LayerStats

    dims = dict(src_heads=2, src_dim=16, tgt_heads=4, tgt_dim=16, gram_dtype=RidgeOptions().gram_dtype)
    one, two = (LayerStats.job_bytes_for(4, 6, **dims, splits=n) for n in (1, 2))
    assert one < two
    kw = dict(top_k=2, stride=2, host=fit_host, distributed=None, memory_budget=one)
    alone = fit(planted["source"], planted["target"], planted["ids"], heldout=0.0, **kw)
    assert [p["tag"] for p in alone.report.passes] == ["joint"] and alone.report.passes[0]["bytes"] <= one
    held = fit(planted["source"], planted["target"], planted["ids"], **kw)  # the default held-out share
    assert len(held.report.passes) > 1 and all(p["bytes"] <= one for p in held.report.passes)


def test_the_budget_check_before_the_corpus_takes_the_one_split_minimum_with_heldout_0(planted, fit_host):
    """The fit refuses a --memory below its smallest workable budget before any pass; with --heldout 0
    that is the train-split-only minimum, so a budget between the two runs the fit."""
    from kvbridge.errors import ConfigError
    from kvbridge.fit import fit
    from kvbridge.fit.plan import minimum_budget

    s, t = (fit_host.spec_of(planted[side]) for side in ("source", "target"))
    fs, ft = s.num_kv_heads * s.head_dim, t.num_kv_heads * t.head_dim
    one, two = (minimum_budget("ridge", s.num_layers, t.num_layers, fs, s.head_dim, ft, 2, n) for n in (1, 2))
    assert one < two
    kw = dict(top_k=2, stride=2, host=fit_host, distributed=None, memory_budget=one)
    alone = fit(planted["source"], planted["target"], planted["ids"], heldout=0.0, **kw)
    assert all(p["bytes"] <= one for p in alone.report.passes)
    with pytest.raises(ConfigError, match="over the .* budget"):
        fit(planted["source"], planted["target"], planted["ids"], **kw)  # the default held-out share: 2 splits


def test_a_small_memory_budget_blocks_over_target_layers_with_the_same_result(planted, planted_fit, fit_host):
    """Bounded memory: selection passes (per-layer blocks) then joint fits per block of target layers."""
    from kvbridge.fit import fit
    from kvbridge.fit.ridge import RidgeOptions
    from kvbridge.fit.stats import LayerStats

    dims = dict(src_heads=2, src_dim=16, tgt_heads=4, tgt_dim=16)
    # statistics + workspace of the fit's (default) gram dtype: the blocking rule
    full = LayerStats.job_bytes_for(4, 6, **dims, gram_dtype=RidgeOptions().gram_dtype)
    budget = full // 3
    blocked = fit(
        planted["source"],
        planted["target"],
        planted["ids"],
        top_k=2,
        stride=2,
        host=fit_host,
        distributed=None,
        memory_budget=budget,
    )
    passes = blocked.report.passes
    assert len(passes) > 2 and all(p["bytes"] <= budget for p in passes)
    assert {p["tag"][:3] for p in passes} == {"sel", "fit"}
    assert blocked.layer_selection() == planted_fit.layer_selection()
    for a, b in zip(blocked.layers, planted_fit.layers):
        for name in ("wk", "bk", "wv", "bv"):
            assert float((getattr(a, name) - getattr(b, name)).abs().max()) <= 1e-5
    with pytest.raises(ConfigError, match="over the 1000 B budget.*GiB"):  # refused before any pass, as the CLI
        fit(
            planted["source"],
            planted["target"],
            planted["ids"][:8],
            top_k=2,
            host=fit_host,
            distributed=None,
            memory_budget=1000,
        )
