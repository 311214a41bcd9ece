"""bench/bench_pair.py: a fit solved from reused statistics equals a fit that runs its own forwards."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_pair.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_pair", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reused_statistics_give_the_mapping_a_fresh_fit_gives():
    from kvbridge.fit import fit
    from kvbridge.fit.calibrate import PairedCalibration
    from kvbridge.plugins import make_host
    from kvbridge.testing.planted import llama_config, llama_model, planted_pair, token_ids

    source = llama_model(llama_config(), seed=0)
    target, _ = planted_pair(source, insert_before=(1, 3), kv_dup=2, seed=123)
    ids = token_ids(12)
    host = make_host(entry_points=False)
    fresh = fit(source, target, ids, top_k=1, alpha=1.0, stride=2, host=host, distributed=None)
    original = PairedCalibration.accumulate
    try:
        cache = _bench().StatsCache()
        first = fit(source, target, ids, top_k=2, alpha=0.01, stride=2, host=host, distributed=None)
        again = fit(source, target, ids, top_k=1, alpha=1.0, stride=2, host=host, distributed=None)
        assert cache.forward_runs == 1  # the second fit ran no forwards
    finally:
        PairedCalibration.accumulate = original
    assert first.layer_selection() != again.layer_selection() or first.report.params != again.report.params
    for a, b in zip(fresh.layers, again.layers):
        assert a.sources == b.sources
        for name in ("wk", "bk", "wv", "bv"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_report_names_a_refused_fit_and_the_fits_beside_it():
    fit_row = {
        "top_k": 4,
        "alpha": "0.01",
        "tokens": 4096,
        "observations_per_feature": 3.5,
        "r2": {"mean": 0.57, "mean_k": 0.69, "mean_v": 0.45, "min": 0.01},
        "layers_v_below_0.5": 16,
        "seconds": 453.3,
    }
    refused = {"top_k": 99, "alpha": "0.01", "error": "underdetermined fit for top-k 28 source layers", "seconds": 0.1}
    text = _bench().report({"fits": [fit_row, refused]})
    assert "fit top-k 4 alpha 0.01: 4096 tokens, 3.5 obs/feature, held-out R² mean 0.570" in text
    assert "fit top-k 99 alpha 0.01: refused: underdetermined fit for top-k 28 source layers" in text


def test_grid_options_and_the_fitter_table():
    bench = _bench()
    assert bench.parse_grid("4:0.01") == (4, "0.01", {})
    assert bench.parse_grid("all:auto:support=head-local+weighting=attention") == (
        99,
        "auto",
        {"support": "head-local", "weighting": "attention"},
    )
    fits = [
        {"top_k": 4, "alpha": "0.01", "options": {}, "dir": "a", "r2": {"mean": 0.5, "mean_k": 0.6, "mean_v": 0.4}},
        {
            "top_k": 4,
            "alpha": "0.01",
            "options": {"support": "head-local", "weighting": "attention"},
            "dir": "b",
            "r2": {"mean": 0.45, "mean_k": 0.5, "mean_v": 0.4},
        },
    ]
    cond = {"gap_recovered": 0.7, "gap_recovered_ci": [0.6, 0.8], "kl_p95": 5.0, "attention_cosine_mean": 0.9}
    r = {
        "fits": fits,
        "eval_main": {
            "mapping": "a",
            "conditions": {"transferred": cond, "source": {"gap_recovered": 0.9}, "native": {"gap_recovered": 1.0}},
        },
        "eval_variants": [{"mapping": "b", "transferred": {**cond, "gap_recovered": 0.75}}],
    }
    rows = bench.fitter_table(r)
    assert any("support=layers weighting=uniform | 0.500 (0.600 / 0.400) | 0.700 [0.600, 0.800]" in x for x in rows)
    assert any("support=head-local weighting=attention" in x and "| 0.750 [0.600, 0.800]" in x for x in rows)
    assert any(x.startswith("| source model alone |") and "0.900" in x for x in rows)


def test_reused_prefills_give_the_results_of_fresh_ones():
    from kvbridge.evaluate import evaluate
    from kvbridge.evaluate.settings import EvalSettings
    from kvbridge.fit import fit
    from kvbridge.plugins import make_host
    from kvbridge.testing.planted import llama_config, llama_model, planted_pair, token_ids

    source = llama_model(llama_config(), seed=0)
    target, _ = planted_pair(source, insert_before=(1, 3), kv_dup=2, seed=123)
    host = make_host(entry_points=False)
    maps = [
        fit(source, target, token_ids(12), top_k=k, alpha=a, stride=2, host=host, distributed=None)
        for k, a in ((1, 1.0), (2, 0.01))
    ]
    samples = token_ids(6)[:, :24]
    cfg = EvalSettings(
        prefix_len=16,
        continuation_len=4,
        greedy_tokens=2,
        batch_size=4,
        conditions=("native", "source", "transferred", "no_prefix"),
        attention=True,
        bootstrap=50,
    )
    reuse = _bench().PrefillReuse(host)
    for m in maps:
        fresh = evaluate(source, target, m, samples, config=cfg, host=host)
        again = evaluate(source, target, m, samples, config=cfg, host=reuse)
        assert fresh["conditions"] == again["conditions"]
    assert reuse.misses == 4 and reuse.hits == 4  # 2 batches x (target, source): computed once, then reused
    assert maps[0].layer_selection() != maps[1].layer_selection()
