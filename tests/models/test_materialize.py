"""kvbridge models materialize: any reference as a safetensors folder transformers (and vLLM) load."""

from __future__ import annotations

import json

import pytest
import torch

from kvbridge.errors import ArtifactError
from kvbridge.models import load
from kvbridge.models.materialize import materialize


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_zoo_model_round_trips_bit_for_bit(tmp_path):
    info = materialize("zoo:base", tmp_path / "out")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(info["files"])
    src, out = load("zoo:base"), load(str(tmp_path / "out"))
    ids = torch.arange(1, 30)[None]
    assert torch.equal(_logits(src.model, ids), _logits(out.model, ids))
    assert src.tokenizer("hello world")["input_ids"] == out.tokenizer("hello world")["input_ids"]


def test_existing_folder_is_refused_then_overwritten(tmp_path):
    out = tmp_path / "out"
    materialize("zoo:base", out)
    with pytest.raises(ArtifactError) as info:
        materialize("zoo:base", out)
    assert "\n" not in str(info.value)
    materialize("zoo:base", out, overwrite=True)
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"


def test_cli_materialize(tmp_path):
    from click.testing import CliRunner

    from kvbridge.cli.main import cli

    res = CliRunner().invoke(cli, ["models", "materialize", "zoo:base", "--out", str(tmp_path / "m"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["model_type"] == "llama"
