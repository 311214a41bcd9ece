"""kvbridge.steer.stages through the Python API on zoo models: build -> run -> eval -> transfer, each
one call taking a loaded model (or pair) and a settings object; refusals before any model loads."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvbridge import api
from kvbridge.errors import KVBridgeError
from kvbridge.steer.settings import SteerBuildSettings, SteerEvalSettings, SteerRunSettings, SteerTransferSettings
from kvbridge.steer.stages import prepare_eval, prepare_run


@pytest.fixture(scope="module")
def base():
    return api.load_model("zoo:base")


@pytest.fixture(scope="module")
def vec(base, pairs_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("stages") / "vec"
    path, manifest = api.steer_build(base, SteerBuildSettings(pairs=str(pairs_file), out=str(out)))
    assert manifest["num_pairs"] == 3 and manifest["tokenizer"]["fingerprint"] and (path / "manifest.json").is_file()
    return out


def test_run_zero_coefficients_are_identical_and_a_push_is_a_different_distribution(base, vec):
    same = api.steer_run(
        base, SteerRunSettings(prompt="ROMEO: I will", vector=str(vec), ck=0.0, cv=0.0, max_new_tokens=4)
    )
    assert same["identical"] and same["first_step_kl"] == pytest.approx(0.0, abs=1e-6)
    pushed = api.steer_run(
        "zoo:base", SteerRunSettings(prompt="ROMEO: I will", vector=str(vec), cv=8.0, max_new_tokens=4, greedy=True)
    )
    assert pushed["steering"]["method"] == "kv-vector" and pushed["first_step_kl"] > 0


def test_eval_writes_its_report(base, vec, tmp_path):
    out = tmp_path / "rep"
    result = api.steer_eval(
        base,
        SteerEvalSettings(
            vector=str(vec),
            prompt="ROMEO: I will",
            scorer="positive_sentiment",
            arms="none,kv",
            samples=2,
            max_new_tokens=3,
            out=str(out),
        ),
    )
    assert set(result["arms"]) == {"none", "kv"} and result["model"] == "zoo:base"
    assert json.loads((out / "report.json").read_text())["arms"].keys() == {"none", "kv"}


def test_refusals_before_a_model_loads(vec, tmp_path):
    with pytest.raises(KVBridgeError, match="does not apply to steering method 'kv-vector'"):
        prepare_run(SteerRunSettings(prompt="p", alpha=1.0))
    with pytest.raises(KVBridgeError, match="unknown scorer"):
        prepare_eval(SteerEvalSettings(vector=str(vec), prompt="p", scorer="sentimnt"))
    with pytest.raises(KVBridgeError):
        prepare_eval(SteerEvalSettings(vector=str(tmp_path / "missing"), prompt="p", scorer="bullets"))


def test_transfer_moves_a_vector_through_a_fitted_mapping(vec, tmp_path):
    texts = [
        f"{i} ROMEO: my sweet love, fair and gentle; JULIET: O woe, foul villain and murder " * 4 for i in range(12)
    ]
    api.fit("zoo:base", "zoo:tuned", texts, seq_len=40, tokens=480, top_k=1, stride=2, out=str(tmp_path / "map"))
    pair = api.load_pair("zoo:base", "zoo:tuned")
    path, mapping = api.steer_transfer(
        pair, SteerTransferSettings(vector=str(vec), mapping=str(tmp_path / "map"), out=str(tmp_path / "moved"))
    )
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["method"] == "transferred(mean)" and manifest["has_residual"] is False
    with pytest.raises(KVBridgeError, match="made for another model"):  # the vector is the source's
        api.steer_transfer(
            api.load_pair("zoo:tuned", "zoo:base"),
            SteerTransferSettings(vector=str(vec), mapping=str(tmp_path / "map"), out=str(tmp_path / "wrong")),
        )
    assert not (tmp_path / "wrong").exists()


def test_transfer_refuses_a_mapping_fitted_with_another_tokenizer(vec, tmp_path):
    """The mapping is checked like eval's: the pair's models and their tokenizer (by digest)."""
    texts = [f"{i} ROMEO: my sweet love, fair and gentle; JULIET: O woe " * 4 for i in range(8)]
    api.fit("zoo:base", "zoo:tuned", texts, seq_len=40, tokens=320, top_k=1, stride=2, out=str(tmp_path / "map"))
    manifest_path = tmp_path / "map" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["tokenizer"]["digest"]
    manifest["tokenizer"]["digest"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    settings = SteerTransferSettings(vector=str(vec), mapping=str(tmp_path / "map"), out=str(tmp_path / "moved"))
    with pytest.raises(KVBridgeError, match="different tokenizer"):
        api.steer_transfer(api.load_pair("zoo:base", "zoo:tuned"), settings)
    assert not (tmp_path / "moved").exists()
    accepted = dataclasses.replace(settings, accept_fingerprint_mismatch=True)  # the refusal's fix works
    api.steer_transfer(api.load_pair("zoo:base", "zoo:tuned"), accepted)
    assert (tmp_path / "moved").is_dir()
