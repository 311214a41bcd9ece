"""``kvbridge pack export --engine llamacpp`` and ``kvbridge engine import`` without llama.cpp: a
zoo pack written as a llama.cpp state for a GGUF header of the same geometry, read back, and the
refusals (another model, truncated file, unknown version, unknown engine) as one line, exit 2."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from click.testing import CliRunner

from kvbridge.cli.main import cli
from tests.gguf_files import tiny_llama_metadata, write_gguf


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(res, text):
    assert res.exit_code == 2, res.output
    assert text in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


@pytest.fixture
def base_gguf(tmp_path):
    """A GGUF header with zoo:base's geometry (llama, 4 layers, 2 KV heads x 32, theta 1e4, 1024 ids)."""
    meta = tiny_llama_metadata(
        llama__block_count=4,
        llama__embedding_length=128,
        llama__attention__head_count=4,
        llama__attention__head_count_kv=2,
        llama__rope__dimension_count=32,
        llama__vocab_size=1024,
    )
    return write_gguf(tmp_path / "base.gguf", meta, [])


@pytest.fixture
def pack(tmp_path):
    out = tmp_path / "pack"
    assert run("pack", "save", "zoo:base", "--guide", "Once upon a time there was", "--out", out).exit_code == 0
    return out


def test_pack_export_then_engine_import(pack, base_gguf, tmp_path):
    out = tmp_path / "guide.llamacpp-seq"
    res = run("pack", "export", pack, "--engine", "llamacpp", "--model", base_gguf, "--out", out, "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["bytes"] == out.stat().st_size and info["v_trans"] is True
    res = run("engine", "import", out, base_gguf, "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["version"] == 3 and got["layers"] == 4 and got["k_row"] == 64 and got["v_trans"]
    assert got["kv_state"]["tokens"] == info["tokens"] and got["kv_state"]["positions"] == [0, info["tokens"] - 1]
    from kvbridge.engines.llamacpp import import_state
    from kvbridge.prefix.packs import read_pack

    _, tensors = read_pack(pack)
    state = import_state(out, base_gguf)
    assert torch.equal(state.token_ids, tensors["token_ids"])
    for i in range(4):  # F16 rounding once, layout permuted there and back
        assert torch.equal(state.keys[i], tensors[f"layers.{i}.keys"].half().float())
    text = run("engine", "import", out, base_gguf).output
    assert "version 3" in text and "4 layers x 2 KV heads x 32" in text


def test_refusals_are_one_line(pack, base_gguf, tmp_path):
    out = tmp_path / "s.llamacpp-seq"
    assert run("pack", "export", pack, "--model", base_gguf, "--out", out).exit_code == 0
    other = write_gguf(tmp_path / "other.gguf", tiny_llama_metadata(), [])  # 2 layers x 2 x 8
    one_line_error(run("pack", "export", pack, "--model", other, "--out", tmp_path / "x"), "has 4 layers; other.gguf")
    assert not (tmp_path / "x").exists()
    one_line_error(run("engine", "import", out, other), "the file is for another model")
    cut = tmp_path / "cut"
    cut.write_bytes(out.read_bytes()[:1000])
    one_line_error(run("engine", "import", cut, base_gguf), "truncated llama.cpp state file")
    data = bytearray(out.read_bytes())
    struct.pack_into("<I", data, 4, 4)
    newer = tmp_path / "newer"
    newer.write_bytes(bytes(data))
    one_line_error(run("engine", "import", newer, base_gguf), "version 4 is not supported")
    one_line_error(
        run("pack", "export", pack, "--engine", "nosuch", "--model", base_gguf, "--out", tmp_path / "y"),
        "unknown engine 'nosuch'",
    )
    one_line_error(
        run("pack", "export", pack, "--model", "zoo:base", "--out", tmp_path / "z"), "llama.cpp runs GGUF files"
    )


def test_pack_export_defaults_the_model_to_the_packs_own(pack, base_gguf, tmp_path):
    """Without --model the export runs on the model the pack was saved with, when it resolves to a file
    the engine runs; --model still picks another file of the same weights; a recorded model the engine
    cannot run is one line naming it."""
    manifest = json.loads((pack / "manifest.json").read_text())
    assert manifest["model"]["reference"] == "zoo:base"  # what `pack save` was given
    one_line_error(
        run("pack", "export", pack, "--out", tmp_path / "z"),
        "was saved with model 'zoo:base', which llamacpp cannot run",
    )
    assert not (tmp_path / "z").exists()
    explicit = tmp_path / "explicit.llamacpp-seq"
    assert run("pack", "export", pack, "--model", base_gguf, "--out", explicit).exit_code == 0
    manifest["model"]["reference"] = str(base_gguf)  # a pack saved from that GGUF records its path
    (pack / "manifest.json").write_text(json.dumps(manifest))
    default = tmp_path / "default.llamacpp-seq"
    res = run("pack", "export", pack, "--out", default, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["model"] == str(base_gguf)
    assert default.read_bytes() == explicit.read_bytes()


def test_transfer_into_an_engine_needs_a_gguf_target_and_one_model_for_identity():
    """``transfer --engine llamacpp`` refuses a target llama.cpp cannot run (a folder model), and
    ``--mapping identity`` refuses two different models, each as one line, before any engine runs."""
    one_line_error(
        run(
            "transfer",
            "zoo:base",
            "zoo:base",
            "--mapping",
            "identity",
            "--engine",
            "llamacpp",
            "--prompt",
            "Once upon a time",
            "--max-new-tokens",
            2,
        ),
        "llama.cpp runs GGUF files",
    )
    one_line_error(
        run("transfer", "zoo:base", "zoo:wide", "--mapping", "identity", "--prompt", "Once upon a time"),
        "--mapping identity needs SOURCE and TARGET to be one model",
    )
