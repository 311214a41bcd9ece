"""Tiny random Llama and the zoo's base model for the recompute tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tiny():
    """A random 3-layer Llama (GQA 4 query / 2 KV heads), float32, eager attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def zoo_base():
    from kvbridge.models import load

    return load("zoo:base").model


@pytest.fixture(scope="module")
def zoo_stranger():
    from kvbridge.models import load

    return load("zoo:stranger").model


def adapter(model):
    from kvbridge.plugins import make_host

    return make_host(entry_points=False).adapter_for(model.config.to_dict())


def cont_logits(model, state, cont):
    with torch.no_grad():
        return model(input_ids=cont, cache=adapter(model).inject(state, model), use_cache=True).logits
