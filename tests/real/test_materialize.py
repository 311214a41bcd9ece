"""kvbridge models materialize on the real GGUF (see tests/real/conftest.py)."""

from __future__ import annotations

import json

import pytest
import torch

from kvbridge.models import load
from kvbridge.models.materialize import materialize


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.real
@pytest.mark.slow
def test_gguf_is_rebuilt_with_the_dequantized_weights(smollm2, tmp_path):
    """transformers refuses save_pretrained on a GGUF-loaded model; the rebuilt folder computes the same."""
    materialize(smollm2.ref.gguf_file, tmp_path / "hf")
    out = load(str(tmp_path / "hf"))
    assert "quantization_config" not in json.loads((tmp_path / "hf" / "config.json").read_text())
    ids = torch.tensor([smollm2.tokenizer("The cat sat on the mat")["input_ids"]])
    assert torch.equal(_logits(smollm2.model, ids), _logits(out.model, ids))
