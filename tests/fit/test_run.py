"""kvbridge.fit.run: fit_run(run) and the one public fit through it on zoo models (text calibration
tokenized with the pair's tokenizer), refusals before any model loads, plan and refit, the deprecated
fit_pair."""

from __future__ import annotations

import json

import pytest

from kvbridge import api
from kvbridge.errors import ConfigError, KVBridgeError
from kvbridge.fit.settings import FitSettings

TEXTS = [
    f"{i} To be, or not to be, that is the question: whether tis nobler in the mind to suffer " * 8 for i in range(24)
]
SMALL = dict(seq_len=64, tokens=1024, top_k=1)


@pytest.fixture(scope="module")
def pair():
    return api.load_pair("zoo:base", "zoo:wide")


def test_api_fit_from_references_with_a_corpus_file_writes_a_mapping(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(TEXTS))
    out = tmp_path / "map"
    mapping = api.fit("zoo:base", "zoo:wide", corpus=str(corpus), out=str(out), **SMALL)
    manifest = json.loads((out / "manifest.json").read_text())
    assert mapping.report is not None and manifest["tokenizer"]["digest"]
    assert manifest["calibration"]["corpus"]["sha256"] and manifest["calibration"]["tokens"] == 1024
    assert (manifest["source"]["name"], manifest["target"]["name"]) == ("zoo:base", "zoo:wide")


def test_fit_run_takes_texts_and_the_api_takes_loaded_models(pair):
    from kvbridge.fit.mapping import FittedMapping
    from kvbridge.fit.run import fit_run
    from kvbridge.run import Run

    settings = FitSettings(**SMALL)
    a = fit_run(Run.of(pair, settings), data=TEXTS)
    b = api.fit(pair.source, pair.target, TEXTS, settings)  # LoadedModels: the pair is built around them
    assert isinstance(a, FittedMapping) and a.layer_selection() == b.layer_selection()
    c = api.fit(pair, data=TEXTS, settings=settings, top_k=2)  # a pair as source; a field replaced
    assert c.report.params["top_k"] == 2


def test_refusals_come_before_any_model_loads(tmp_path, monkeypatch):
    from kvbridge.models import loading

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "load", no_load)
    with pytest.raises(ConfigError, match="has no setting 'seqlen'.*did you mean seq_len"):
        api.fit("zoo:base", "zoo:wide", TEXTS, seqlen=64)
    with pytest.raises(KVBridgeError, match="has no option 'topk'"):
        api.fit("zoo:base", "zoo:wide", TEXTS, fitter_options=("topk=2",))
    with pytest.raises(KVBridgeError, match="no such corpus"):
        api.fit("zoo:base", "zoo:wide", corpus=str(tmp_path / "missing.txt"))
    with pytest.raises(ConfigError, match="fit needs calibration data"):
        api.fit("zoo:base", "zoo:wide")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("mine")
    with pytest.raises(KVBridgeError, match="refusing to replace it"):
        api.fit("zoo:base", "zoo:wide", TEXTS, out=str(tmp_path / "taken"))
    with pytest.raises(ConfigError, match="fit takes model references"):
        api.fit(object(), object(), TEXTS)


def test_keep_stats_then_refit_and_plan_take_the_settings(pair, tmp_path):
    from kvbridge.fit.run import plan_fit, refit

    kept = tmp_path / "stats"
    api.fit(pair, data=TEXTS, settings=FitSettings(seq_len=64, tokens=1024, top_k=2, keep_stats=str(kept)))
    again = refit("zoo:base", "zoo:wide", FitSettings(from_stats=str(kept), out=str(tmp_path / "m"), top_k=1))
    assert again.report.params["top_k"] == 1 and (tmp_path / "m" / "manifest.json").is_file()
    with pytest.raises(KVBridgeError, match="source"):  # kept statistics of other models are refused
        refit("zoo:wide", "zoo:base", FitSettings(from_stats=str(kept), out=str(tmp_path / "m2"), top_k=1))
    with pytest.raises(ConfigError, match="--corpus does not apply"):
        refit("zoo:base", "zoo:wide", FitSettings(from_stats=str(kept), out=str(tmp_path / "m3"), corpus="c"))
    lines = plan_fit("zoo:base", "zoo:wide", FitSettings(top_k="all", tokens=4096)).lines()
    assert lines and any("4096" in ln or "4,096" in ln for ln in lines)
    f64 = plan_fit(
        "zoo:base", "zoo:wide", FitSettings(top_k="all", tokens=4096, fitter_options=("gram_dtype=float64",))
    )
    assert f64.lines() != lines  # -o gram_dtype= reaches the plan (its workspace and rate)
    with pytest.raises(KVBridgeError, match="gram_dtype='float16' is not one of float32, float64"):
        plan_fit("zoo:base", "zoo:wide", FitSettings(tokens=4096, fitter_options=("gram_dtype=float16",)))


def test_a_default_top_k_over_the_source_layers_is_clamped_with_a_note(fit_host):
    from types import SimpleNamespace

    from kvbridge.fit.run import fit_run
    from kvbridge.models.pair import ModelPair
    from kvbridge.run import Run
    from kvbridge.testing.planted import llama_config, llama_model, token_ids

    def loaded(model, name):  # what fit_pair asks of a LoadedModel (token ids: no tokenizer needed)
        spec = fit_host.adapter_for(model.config.to_dict()).spec_of(model)
        return SimpleNamespace(
            model=model, tokenizer=None, name=name, spec=spec, ref=SimpleNamespace(ref=name, kind="folder", folder=None)
        )

    pair = ModelPair(
        loaded(llama_model(llama_config(num_hidden_layers=2), seed=0), "small"),
        loaded(llama_model(llama_config(num_hidden_layers=3), seed=1), "big"),
        {},
    )
    notes = []
    run = Run.of(pair, FitSettings(seq_len=48, stride=2), fit_host)
    m = fit_run(run, data=token_ids(24), warn=notes.append, distributed=None)
    assert notes == ["--top-k defaults to 4, but small has 2 layers: using --top-k 2 (all of them)"]
    assert all(len(s) == 2 for s in m.layer_selection())


def test_the_run_identifies_each_model_once_and_fit_pair_still_runs_deprecated(pair, monkeypatch):
    from kvbridge.fit import artifact
    from kvbridge.fit.pipeline import identity
    from kvbridge.fit.run import fit_pair, fit_run
    from kvbridge.run import Run

    calls = []
    real = artifact.model_identity
    monkeypatch.setattr(artifact, "model_identity", lambda *a, **k: calls.append(1) or real(*a, **k))
    run = Run.of(pair, FitSettings(**SMALL))
    a = fit_run(run, data=TEXTS)
    assert len(calls) == 2 and identity(run, "source") is identity(run.with_settings(None), "source")
    assert len(calls) == 2  # kept on the run (and on a run made from it)
    with pytest.warns(DeprecationWarning, match="fit_pair"):
        b = fit_pair(pair, FitSettings(**SMALL), data=TEXTS)
    assert a.layer_selection() == b.layer_selection()
    assert a.manifest["source"] == b.manifest["source"]
