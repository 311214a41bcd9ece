"""Wrapper resolution (``text_config``) in the Python API, as ``describe`` does it."""

from __future__ import annotations

import kvbridge
from kvbridge.family_adapter import TextConfigAdapter, text_config_of
from kvbridge.plugins import make_host

GEMMA3 = {
    "model_type": "gemma3",
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "num_hidden_layers": 34,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
    },
}


def test_text_config_keeps_the_wrapper_dtype():
    text = text_config_of(GEMMA3)
    assert text["model_type"] == "gemma3_text" and text["dtype"] == "bfloat16"
    assert text_config_of({"model_type": "llama"}) is None


def test_api_describe_resolves_the_wrapper_like_the_cli():
    host = make_host(entry_points=False)
    adapter = host.adapter_for(GEMMA3)
    assert isinstance(adapter, TextConfigAdapter) and adapter.inner.name == "gemma3_text"
    spec = kvbridge.describe(GEMMA3, host=host)
    assert (spec.family, spec.num_layers, spec.dtype) == ("gemma3_text", 34, "bfloat16")
    from kvbridge.check.sources import describe_config

    assert describe_config(GEMMA3, host=host) == spec
