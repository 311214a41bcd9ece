"""The shipped tiny model zoo: manifest vs files, genuine training, geometry relations, loading
(the recipes, the build and its determinism: tests/tools/test_zoo_build.py)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvbridge.zoo import ZOO_NAMES, model_dir, read_manifest, zoo_dir

ROOT = Path(__file__).resolve().parents[2] / "src" / "kvbridge" / "zoo" / "models"
#: a trained model's held-out loss must beat the held-out unigram entropy by at least this (nats/token)
MARGIN = 1.0
#: all weights together may not exceed this (package-data budget; the build checks it too)
MAX_WEIGHTS_BYTES = 16 * 1024 * 1024


@pytest.fixture(scope="module")
def manifest() -> dict:
    return read_manifest(ROOT)


def _config(name: str) -> dict:
    return json.loads((ROOT / name / "config.json").read_text())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_zoo_dir_is_the_package_folder(monkeypatch):
    monkeypatch.delenv("KVBRIDGE_ZOO_DIR", raising=False)
    assert zoo_dir().resolve() == ROOT.resolve()
    assert set(ZOO_NAMES) == {"base", "wide", "odd", "tuned", "stranger"}


def test_manifest_is_consistent_with_files(manifest):
    assert manifest["names"] == list(ZOO_NAMES) and set(manifest["models"]) == set(ZOO_NAMES)
    assert "torch" in manifest["built_with"]
    recorded = dict(manifest["tokenizer"]["files"])
    total = 0
    for name, rec in manifest["models"].items():
        assert rec["training_tokens"] > 0 and rec["params"] > 0
        assert f"{name}/model.safetensors" in rec["files"]
        recorded.update(rec["files"])
        total += rec["files"][f"{name}/model.safetensors"]["bytes"]
    on_disk = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()} - {"manifest.json"}
    assert on_disk == set(recorded), "files under zoo/models differ from the manifest"
    for rel, info in recorded.items():
        path = ROOT / rel
        assert path.stat().st_size == info["bytes"], rel
        assert _sha(path) == info["sha256"], f"{rel} does not match its recorded sha256"
    assert total == manifest["weights_bytes_total"] <= MAX_WEIGHTS_BYTES


def test_weights_are_half_precision_safetensors():
    from safetensors import safe_open

    for name in ZOO_NAMES:
        with safe_open(str(ROOT / name / "model.safetensors"), "np") as f:
            dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}
        assert dtypes <= {"F16", "BF16"}, (name, dtypes)


def test_every_model_is_genuinely_trained(manifest):
    entropy = manifest["heldout"]["unigram_entropy"]
    assert 4.0 < entropy < 7.0
    for name, rec in manifest["models"].items():
        assert rec["unigram_entropy"] == entropy
        assert rec["heldout_loss"] < entropy - MARGIN, (name, rec["heldout_loss"], entropy)
        assert rec["heldout_scored_tokens"] == manifest["heldout"]["scored_tokens"] >= 32768
        text = rec["sample"]["text"]
        assert text.startswith(rec["sample"]["prompt"]) and text.count("\n") >= 3, (name, text)


def test_tuned_learned_its_slice(manifest):
    base, tuned = manifest["models"]["base"], manifest["models"]["tuned"]
    assert tuned["train_split"] == "tune" and base["train_split"] == "base"
    assert tuned["tune_loss"] < base["tune_loss"]
    assert tuned["total_training_tokens"] == base["total_training_tokens"] + tuned["training_tokens"]


def test_splits_are_contiguous_and_disjoint(manifest):
    s = manifest["splits"]
    assert s["base"]["chars"][0] == 0
    assert s["base"]["chars"][1] == s["tune"]["chars"][0]
    assert s["tune"]["chars"][1] == s["heldout"]["chars"][0]
    assert s["heldout"]["chars"][1] == manifest["corpus"]["chars"]


def test_wide_shares_kv_shape_but_not_depth_width_rope():
    base, wide = _config("base"), _config("wide")
    assert wide["num_key_value_heads"] == base["num_key_value_heads"]
    assert wide["head_dim"] == base["head_dim"]
    assert wide["num_hidden_layers"] != base["num_hidden_layers"]
    assert wide["hidden_size"] != base["hidden_size"]
    assert wide["rope_parameters"]["rope_theta"] != base["rope_parameters"]["rope_theta"]
    assert wide["vocab_size"] == base["vocab_size"]


def test_odd_differs_in_kv_geometry():
    base, odd = _config("base"), _config("odd")
    assert (odd["num_key_value_heads"], odd["head_dim"]) != (base["num_key_value_heads"], base["head_dim"])
    assert odd["vocab_size"] == base["vocab_size"]


def _tensors(name):
    from safetensors.numpy import load_file

    return load_file(str(ROOT / name / "model.safetensors"))


@pytest.mark.parametrize("other", ["tuned", "stranger"])
def test_same_architecture_different_weights(other):
    import numpy as np

    drop = {"transformers_version", "dtype"}
    assert {k: v for k, v in _config(other).items() if k not in drop} == {
        k: v for k, v in _config("base").items() if k not in drop
    }
    a, b = _tensors("base"), _tensors(other)
    assert a.keys() == b.keys()
    differ = [k for k in a if a[k].shape == b[k].shape and not np.array_equal(a[k], b[k])]
    assert len(differ) == len(a), f"{other}: tensors equal to base: {set(a) - set(differ)}"
    if other == "tuned":  # a continuation stays close to base; a fresh seed does not
        emb = "model.embed_tokens.weight"
        rel = lambda x: float(np.linalg.norm((x[emb] - a[emb]).astype("f4")) / np.linalg.norm(a[emb].astype("f4")))
        assert rel(b) < 0.5 * rel(_tensors("stranger"))


def test_tokenizer_loads_with_autotokenizer_and_round_trips(manifest):
    from transformers import AutoTokenizer

    shared = _sha(ROOT / "tokenizer" / "tokenizer.json")
    for name in ZOO_NAMES:
        assert _sha(ROOT / name / "tokenizer.json") == shared, f"{name} has another tokenizer"
    tok = AutoTokenizer.from_pretrained(str(ROOT / "tokenizer"), local_files_only=True)
    assert len(tok) == manifest["tokenizer"]["vocab_size"]
    assert tok.eos_token == manifest["tokenizer"]["special_token"]
    for text in [
        "First Citizen:\nBefore we proceed any further, hear me speak.\n",
        "  odd   spacing\t\ttabs\n\n",
        "naïve café – ünïcødé ✓ 日本語",
        "",
    ]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    assert len(tok("To be, or not to be")["input_ids"]) < len("To be, or not to be")


def test_models_load_offline_and_run(monkeypatch):
    import torch

    from kvbridge.zoo.load import load_zoo_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    for name in ZOO_NAMES:
        model, tok = load_zoo_model(name, root=ROOT)
        assert type(model).__name__ == "LlamaForCausalLM" and not model.training
        assert next(model.parameters()).dtype == torch.float32
        ids = torch.tensor([tok("KING RICHARD:\n", add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        assert logits.shape[-1] == len(tok) and torch.isfinite(logits).all()
    model, _ = load_zoo_model("base", dtype=torch.bfloat16, root=ROOT)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_unknown_model_is_a_one_line_error():
    from kvbridge.errors import KVBridgeError

    with pytest.raises(KVBridgeError, match="no zoo model 'nope'"):
        model_dir("nope", ROOT)


def test_unbuilt_zoo_names_the_rebuild(monkeypatch, tmp_path):
    from kvbridge.errors import ConfigError
    from kvbridge.models import resolve

    monkeypatch.setenv("KVBRIDGE_ZOO_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="config.json is missing") as err:
        resolve("zoo:base")
    assert "reinstall kvbridge" in err.value.fix


def test_zoo_list_does_not_import_torch():
    code = "\n".join(
        [
            "import sys",
            "from kvbridge.cli.main import build_cli",
            "try:",
            "    build_cli().main(args=['zoo', 'list'], standalone_mode=False)",
            "except SystemExit:",
            "    pass",
            "print('HEAVY', [m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules])",
        ]
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "HEAVY []" in res.stdout
    for name in ZOO_NAMES:
        assert f"\n{name} " in res.stdout
    assert "unigram" in res.stdout


def test_zoo_list_json_and_missing_manifest(tmp_path):
    from click.testing import CliRunner

    from kvbridge.cli.main import cli

    res = CliRunner().invoke(cli, ["zoo", "list", "--json", "--dir", str(ROOT)])
    assert res.exit_code == 0 and set(json.loads(res.output)["models"]) == set(ZOO_NAMES)
    res = CliRunner().invoke(cli, ["zoo", "list", "--dir", str(tmp_path)])
    assert res.exit_code == 2 and "zoo manifest not found" in res.output
