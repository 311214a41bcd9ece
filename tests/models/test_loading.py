"""load(): one dtype policy, frozen LoadedModel, one-line errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbridge.errors import ConfigError
from kvbridge.models import load
from kvbridge.models.loading import dtype_for
from kvbridge.models import resolve


def test_zoo_loads_in_float32_by_default_and_auto_is_the_checkpoint_dtype():
    lm = load("zoo:base")
    assert next(lm.model.parameters()).dtype == torch.float32 and lm.spec.dtype == "float32"
    assert lm.fingerprint["dtype"] == "float32" and len(lm.fingerprint["weights"]) == 64
    assert lm.tokenizer("to be")["input_ids"] and not lm.model.training
    with pytest.raises(dataclasses.FrozenInstanceError):
        lm.model = None
    assert dtype_for(resolve("zoo:base"), "auto") == "float16"
    assert next(load("zoo:base", dtype="bfloat16", tokenizer=False).model.parameters()).dtype == torch.bfloat16


def test_refusals():
    with pytest.raises(ConfigError, match="unknown dtype 'float8'"):
        load("zoo:base", dtype="float8")
    with pytest.raises(ConfigError, match="manifest reference has no weights"):
        load("Qwen/Qwen2.5-0.5B")


def test_python_api_takes_references():
    import kvbridge

    assert kvbridge.describe("zoo:odd").num_kv_heads == kvbridge.resolve_model("zoo:odd").spec().num_kv_heads
    assert kvbridge.adapter_for("zoo:base").name == "llama"
    lm = kvbridge.load_model("zoo:base", dtype="auto")
    assert lm.dtype == "float16" and lm.ref.kind == "zoo"
