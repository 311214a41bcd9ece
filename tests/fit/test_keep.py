"""A k sweep from one pass, kept statistics and refits from them, the default top-k clamp."""

from __future__ import annotations

import json
import warnings

import pytest

from kvbridge.errors import ArtifactError, KVBridgeError


def _same(a, b, tol=1e-6):
    assert a.layer_selection() == b.layer_selection()
    for la, lb in zip(a.layers, b.layers):
        for name in ("wk", "bk", "wv", "bv"):
            assert float((getattr(la, name) - getattr(lb, name)).abs().max()) <= tol, name


class Counting:
    """A progress callback counting the passes over the corpus (each one runs both models)."""

    def __init__(self):
        self.passes = 0

    def __call__(self, event):
        if event[0] == "start":
            self.passes += 1


@pytest.fixture(scope="module")
def sweep(planted, fit_host, tmp_path_factory):
    from kvbridge.fit import fit

    root = tmp_path_factory.mktemp("sweep")
    counter = Counting()
    out = fit(
        planted["source"],
        planted["target"],
        planted["ids"],
        top_k=[1, 2, "all"],
        stride=2,
        host=fit_host,
        distributed=None,
        out=root / "maps",
        keep_stats=root / "stats",
        progress=counter,
    )
    return {"root": root, "mappings": out, "passes": counter.passes}


def test_a_k_sweep_runs_the_models_once_and_equals_separate_fits(planted, planted_fit, fit_host, sweep):
    from kvbridge.fit import fit
    from kvbridge.fit.artifact import load_mapping

    maps = sweep["mappings"]
    assert sorted(maps) == ["1", "2", "all"] and sweep["passes"] == 1
    _same(maps["2"], planted_fit)  # the sweep's k=2 is the ordinary top-k 2 fit
    one = fit(planted["source"], planted["target"], planted["ids"], top_k=1, stride=2, host=fit_host, distributed=None)
    _same(maps["1"], one)
    assert all(len(s) == 4 for s in maps["all"].layer_selection())  # all 4 source layers
    for label in ("1", "2", "all"):
        loaded = load_mapping(sweep["root"] / "maps" / f"k{label}")
        _same(loaded, maps[label], tol=0)
        assert loaded.manifest["fitter"]["params"]["top_k"] == (4 if label == "all" else int(label))


def test_kept_statistics_refit_other_k_and_alpha_without_models(planted, fit_host, sweep, tmp_path):
    from kvbridge.fit import fit
    from kvbridge.fit.pipeline import fit_from_stats

    stats = sweep["root"] / "stats"
    manifest = json.loads((stats / "manifest.json").read_text())
    assert manifest["kind"] == "kvbridge-fit-stats" and manifest["max_k"] == 4
    assert manifest["source"]["weights_fingerprint"] and manifest["target"]["weights_fingerprint"]
    assert not list(stats.glob("*.pkl")) and all((stats / b["file"]).is_file() for b in manifest["blocks"])
    again = fit_from_stats(stats, top_k=2, out=tmp_path / "k2")
    _same(again, sweep["mappings"]["2"], tol=0)
    assert json.loads((tmp_path / "k2" / "manifest.json").read_text())["source"] == manifest["source"]
    strong = fit_from_stats(stats, top_k="1,2", alpha=10.0)
    direct = fit(
        planted["source"],
        planted["target"],
        planted["ids"],
        top_k=1,
        alpha=10.0,
        stride=2,
        host=fit_host,
        distributed=None,
    )
    _same(strong["1"], direct)


def test_kept_statistics_for_other_models_or_damaged_are_refused(planted, sweep, tmp_path):
    import shutil

    from kvbridge.fit.pipeline import fit_from_stats

    stats = sweep["root"] / "stats"
    with pytest.raises(ArtifactError, match="different source model: field source.spec_fingerprint"):
        fit_from_stats(stats, source=planted["target"].config.to_dict())
    from kvbridge.testing.planted import llama_model

    twin = llama_model(planted["target"].config.to_dict(), seed=99)  # same spec, other weights
    with pytest.raises(ArtifactError, match="different target model: field target.weights_fingerprint"):
        fit_from_stats(stats, target=twin)  # a loaded model: its weights are compared too
    with pytest.raises(KVBridgeError, match="--top-k 9 is larger"):
        fit_from_stats(stats, top_k=9)
    bad = tmp_path / "bad"
    shutil.copytree(stats, bad)
    block = bad / "block0.safetensors"
    block.write_bytes(block.read_bytes()[:-8])
    with pytest.raises(ArtifactError, match="block0.safetensors checksum mismatch"):
        fit_from_stats(bad, top_k=1)
    with pytest.raises(ArtifactError, match="not a kvbridge fit-statistics folder"):
        fit_from_stats(sweep["root"] / "maps" / "k1")


def test_blocked_statistics_are_kept_block_by_block(planted, fit_host, tmp_path):
    from kvbridge.fit import fit
    from kvbridge.fit.pipeline import fit_from_stats
    from kvbridge.fit.stats import LayerStats

    budget = LayerStats.job_bytes_for(4, 6, src_heads=2, src_dim=16, tgt_heads=4, tgt_dim=16) // 3
    maps = fit(
        planted["source"],
        planted["target"],
        planted["ids"],
        top_k=[1, 2],
        stride=2,
        host=fit_host,
        distributed=None,
        memory_budget=budget,
        keep_stats=tmp_path / "stats",
    )
    blocks = json.loads((tmp_path / "stats" / "manifest.json").read_text())["blocks"]
    assert len(blocks) > 1
    _same(fit_from_stats(tmp_path / "stats", top_k=1), maps["1"], tol=0)
    with pytest.raises(KVBridgeError, match="kept for top-k 2"):
        fit_from_stats(tmp_path / "stats", top_k=3)


def test_default_top_k_is_clamped_to_a_small_source_and_says_so(fit_host):
    from kvbridge.fit import fit
    from kvbridge.testing.planted import llama_config, llama_model, token_ids

    small = llama_model(llama_config(num_hidden_layers=2), seed=0)
    target = llama_model(llama_config(num_hidden_layers=3), seed=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        m = fit(small, target, token_ids(24), stride=2, host=fit_host, distributed=None)
    assert any("defaults to 4" in str(w.message) and "2 layers" in str(w.message) for w in seen)
    assert all(len(s) == 2 for s in m.layer_selection())
    with pytest.raises(KVBridgeError, match="--top-k 3 is larger than the source model's 2 layers"):
        fit(small, target, token_ids(24), top_k=3, stride=2, host=fit_host, distributed=None)


def test_top_k_lists_are_parsed_or_refused_by_name():
    from kvbridge.fit.pipeline import parse_top_k

    assert parse_top_k("4") == 4 and parse_top_k("1,2,4,8,all") == [1, 2, 4, 8, "all"]
    assert parse_top_k(" 2 , 2 ,all") == [2, "all"]
    for bad in ("0,1", "1,,2", "two", "1,-3", ""):
        with pytest.raises(KVBridgeError, match="--top-k"):
            parse_top_k(bad)


def test_chunks_kept_by_separate_runs_merge_into_the_fit_of_all_of_them(planted, fit_host, tmp_path):
    """Calibration volume across runs: two runs on disjoint chunks (--tokens-offset), their kept
    statistics merged (--from-stats A,B), equal one run over both chunks (stride 1, no held-out split:
    the same observations either way); the manifest sums the tokens and names the chunks."""
    from kvbridge.fit import fit
    from kvbridge.fit.pipeline import fit_from_stats

    ids = planted["ids"]
    seq = ids.shape[1]
    half = (ids.shape[0] // 2) * seq
    common = dict(top_k=2, stride=1, heldout=0.0, host=fit_host, distributed=None)
    for name, offset in (("a", 0), ("b", half)):
        fit(
            planted["source"],
            planted["target"],
            ids,
            tokens=half,
            offset=offset,
            keep_stats=tmp_path / name,
            **common,
        )
    merged = fit_from_stats(f"{tmp_path / 'a'},{tmp_path / 'b'}", top_k=2)
    whole = fit(planted["source"], planted["target"], ids, tokens=2 * half, **common)
    _same(merged, whole, tol=1e-4)
    cal = merged.manifest["calibration"]
    assert cal["tokens"] == 2 * half and [m["offset"] for m in cal["merged_from"]] == [0, half]
    assert cal["observations_per_feature"] == round(cal["observations_train"] / cal["features_per_head"], 3)
    with pytest.raises(ArtifactError, match="same calibration tokens"):
        fit_from_stats(f"{tmp_path / 'a'},{tmp_path / 'a'}", top_k=2)
