"""`kvbridge check` and `kvbridge describe`: output, exit codes, one-line errors, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from kvbridge.cli.main import build_cli
from kvbridge.testing.cli import one_line_error as assert_one_line_error


@pytest.fixture(autouse=True)
def _isolated(isolated_env, monkeypatch):
    monkeypatch.delenv("KVBRIDGE_DEBUG", raising=False)


def run(*args):
    result = CliRunner().invoke(build_cli(), list(args))
    return result


# -- check ------------------------------------------------------------------------------------------------------
def test_check_json_shape(configs):
    r = run("check", str(configs / "Qwen__Qwen2.5-0.5B"), str(configs / "Qwen__Qwen2.5-1.5B-Instruct"), "--json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert list(data) == ["source", "target", "axes", "verdict", "reasons", "measured"]
    assert data["verdict"] == "mappable"
    layers = next(a for a in data["axes"] if a["name"] == "layers")
    assert layers == {"name": "layers", "source": 24, "target": 28, "verdict": "mappable", "action": layers["action"]}
    assert data["source"]["rope"]["type"] == "default" and data["source"]["num_kv_heads"] == 2


def test_check_by_manifest_name():
    r = run("check", "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B")
    assert r.exit_code == 0
    out = r.stdout
    for axis in (
        "model",
        "layers",
        "kv_heads",
        "head_dim",
        "positional",
        "rope",
        "attention",
        "dtype",
        "cache_format",
        "tokenizer",
    ):
        assert f"  {axis} " in out, axis
    assert "verdict: mappable" in out


def test_incompatible_exits_1(configs):
    r = run("check", str(configs / "openai-community__gpt2"), str(configs / "meta-llama__Llama-3.2-1B"))
    assert r.exit_code == 1
    assert "verdict: incompatible" in r.stdout and "absolute" in r.stdout


def test_strict(configs):
    same = run("check", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B", "--strict")
    assert same.exit_code == 0 and "strict: passes" in same.stdout
    mapped = run("check", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B", "--strict")
    assert mapped.exit_code == 1 and "strict: fails" in mapped.stdout
    assert run("check", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B").exit_code == 0
    js = run("check", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B", "--strict", "--json")
    assert js.exit_code == 1 and json.loads(js.stdout)["verdict"] == "mappable"
    assert "strict: fails" in js.stderr


def test_tokenizer_options(configs, shared_dir):
    tok = shared_dir / "fixtures" / "tokenizers"
    r = run(
        "check",
        str(configs / "Qwen__Qwen2.5-0.5B"),
        str(configs / "Qwen__Qwen2.5-1.5B-Instruct"),
        "--json",
        "--source-tokenizer",
        str(tok / "qwen2.5"),
        "--target-tokenizer",
        str(tok / "gpt2"),
    )
    assert r.exit_code == 1
    axis = next(a for a in json.loads(r.stdout)["axes"] if a["name"] == "tokenizer")
    assert axis["verdict"] == "blocking"
    bad = run("check", "gpt2", "gpt2", "--source-tokenizer", str(shared_dir / "nope"))
    assert_one_line_error(bad, "no such file")


def test_unknown_model_suggests():
    r = run("check", "Qwen/Qwen2.5-0.6B", "gpt2")
    assert_one_line_error(r, "unknown model 'Qwen/Qwen2.5-0.6B'", "did you mean", "Qwen/Qwen2.5-0.5B")


def test_bad_inputs_name_file_and_field(tmp_path, configs):
    good = str(configs / "meta-llama__Llama-3.2-1B")
    base = json.loads((configs / "meta-llama__Llama-3.2-1B" / "config.json").read_text())

    nojson = tmp_path / "a" / "config.json"
    nojson.parent.mkdir()
    nojson.write_text("{'model_type': 'llama'}")
    assert_one_line_error(run("check", str(nojson), good), str(nojson), "not valid JSON")

    heads = tmp_path / "b" / "config.json"
    heads.parent.mkdir()
    heads.write_text(json.dumps({k: v for k, v in base.items() if k != "num_attention_heads"}))
    assert_one_line_error(run("check", good, str(heads)), str(heads), "num_attention_heads")

    negative = tmp_path / "c" / "config.json"
    negative.parent.mkdir()
    negative.write_text(json.dumps(dict(base, num_hidden_layers=-1)))
    assert_one_line_error(run("check", str(negative), good), str(negative), "num_hidden_layers")

    empty = tmp_path / "d"
    empty.mkdir()
    assert_one_line_error(run("check", str(empty), good), str(empty), "no config.json")

    mamba = tmp_path / "e" / "config.json"
    mamba.parent.mkdir()
    mamba.write_text(json.dumps({"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24}))
    assert_one_line_error(run("check", good, str(mamba)), str(mamba), "model_type", "no attention KV cache")


def test_help_documents_exit_codes_and_strict():
    text = run("check", "--help").stdout
    assert "Exit status" in text and "--strict" in text and "--json" in text and "manifests" in text
    assert "identity" in text and "rope-reapply" in text
    assert "MODEL" in run("describe", "--help").stdout


# -- describe ---------------------------------------------------------------------------------------------------
def test_describe_human_and_json(configs):
    r = run("describe", str(configs / "microsoft__phi-2"))
    assert r.exit_code == 0 and "partial=0.4" in r.stdout and "rotary_dim 32 of 80" in r.stdout
    js = json.loads(run("describe", str(configs / "mistralai__Mistral-7B-v0.1"), "--json").stdout)
    assert js["spec"]["sliding_window"] == 4096 and js["kind"] == "dir"
    assert js["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 and js["tokenizer"] == "unknown"


def test_describe_manifest_with_tokenizer():
    js = json.loads(run("describe", "gpt2", "--json").stdout)
    assert js["name"] == "openai-community/gpt2" and js["spec"]["positional"] == "absolute"
    assert js["tokenizer"]["vocab_size"] == 50257


def test_describe_list():
    r = run("describe", "--list", "--json")
    ids = {row["id"] for row in json.loads(r.stdout)}
    assert {"Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B", "openai-community/gpt2"} <= ids
    assert "Qwen/Qwen3-8B" in run("describe", "--list").stdout


def test_describe_errors(tmp_path):
    assert_one_line_error(run("describe"), "missing MODEL")
    assert_one_line_error(run("describe", str(tmp_path)), "no config.json")


# -- no torch, in a fresh interpreter ----------------------------------------------------------------------------------
def test_check_and_describe_do_not_import_torch(configs, tmp_path):
    code = (
        "import sys\n"
        "from kvbridge.cli.main import main\n"
        f'for argv in (["check", {str(configs / "Qwen__Qwen2.5-0.5B")!r}, {str(configs / "Qwen__Qwen3-4B")!r}],\n'
        "             ['check', 'Qwen/Qwen2.5-0.5B', 'Qwen/Qwen2.5-1.5B', '--json'],\n"
        "             ['describe', 'google/gemma-3-1b-it']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code in (0, None), exc.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'tokenizers', 'numpy') if m in sys.modules)\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, heavy\n"
    )
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "none"), KVBRIDGE_CACHE_DIR=str(tmp_path / "c"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
