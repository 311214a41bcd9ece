"""Hand-written configs shaped like published checkpoints of the families that have no fixture
under ../shared (key names and layout as those checkpoints use them; sizes kept realistic).

Each is checked against transformers' own reading, plus the one fact it is here for.
"""

from __future__ import annotations

import copy

import pytest
from family_oracle import assert_agrees_with_hf, hf_config

from kvbridge.spec import FULL, SLIDING

SHAPES = {
    "gemma-3-1b-like": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 26,
        "hidden_size": 1152,
        "intermediate_size": 6912,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "rope_theta": 1000000,
        "rope_local_base_freq": 10000,
        "rope_scaling": None,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 32768,
        "vocab_size": 262144,
        "query_pre_attn_scalar": 256,
        "torch_dtype": "bfloat16",
    },
    "gemma-2-2b-like": {
        "model_type": "gemma2",
        "num_hidden_layers": 26,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "max_position_embeddings": 8192,
        "vocab_size": 256000,
        "torch_dtype": "float32",
    },
    "falcon-7b-like": {
        "model_type": "falcon",
        "num_hidden_layers": 32,
        "hidden_size": 4544,
        "num_attention_heads": 71,
        "multi_query": True,
        "new_decoder_architecture": False,
        "alibi": False,
        "parallel_attn": True,
        "bias": False,
        "vocab_size": 65024,
        "torch_dtype": "bfloat16",
    },
    "falcon-40b-like": {
        "model_type": "falcon",
        "num_hidden_layers": 60,
        "hidden_size": 8192,
        "num_attention_heads": 128,
        "num_kv_heads": 8,
        "new_decoder_architecture": True,
        "alibi": False,
        "parallel_attn": True,
        "bias": False,
        "vocab_size": 65024,
        "torch_dtype": "bfloat16",
    },
    "falcon-rw-1b-like": {
        "model_type": "falcon",
        "num_hidden_layers": 24,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "alibi": True,
        "multi_query": False,
        "new_decoder_architecture": False,
        "parallel_attn": False,
        "bias": True,
        "vocab_size": 50304,
        "torch_dtype": "bfloat16",
    },
    "pythia-160m-like": {
        "model_type": "gpt_neox",
        "num_hidden_layers": 12,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "rotary_pct": 0.25,
        "rotary_emb_base": 10000,
        "max_position_embeddings": 2048,
        "vocab_size": 50304,
        "use_parallel_residual": True,
        "torch_dtype": "float16",
    },
    "phi-3-mini-128k-like": {
        "model_type": "phi3",
        "num_hidden_layers": 32,
        "hidden_size": 3072,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "sliding_window": 262144,
        "vocab_size": 32064,
        "torch_dtype": "bfloat16",
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0 + i / 100 for i in range(48)],
            "long_factor": [1.0 + i / 2 for i in range(48)],
        },
    },
    "gpt-j-6b-like": {
        "model_type": "gptj",
        "n_layer": 28,
        "n_embd": 4096,
        "n_head": 16,
        "rotary_dim": 64,
        "n_positions": 2048,
        "vocab_size": 50400,
        "torch_dtype": "float32",
    },
    "command-r-like": {
        "model_type": "cohere",
        "num_hidden_layers": 40,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "rope_theta": 8000000.0,
        "max_position_embeddings": 8192,
        "use_qk_norm": False,
        "vocab_size": 256000,
        "torch_dtype": "float16",
    },
    "olmo-2-7b-like": {
        "model_type": "olmo2",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "rope_theta": 500000,
        "max_position_embeddings": 4096,
        "vocab_size": 100352,
        "torch_dtype": "float32",
    },
    "stablelm-2-1.6b-like": {
        "model_type": "stablelm",
        "num_hidden_layers": 24,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000,
        "max_position_embeddings": 4096,
        "vocab_size": 100352,
        "use_qkv_bias": True,
        "qk_layernorm": False,
        "torch_dtype": "bfloat16",
    },
    "gemma-7b-like": {
        "model_type": "gemma",
        "num_hidden_layers": 28,
        "hidden_size": 3072,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "rope_theta": 10000.0,
        "max_position_embeddings": 8192,
        "vocab_size": 256000,
        "torch_dtype": "bfloat16",
    },
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_published_shapes_agree_with_transformers(host, name):
    cfg = SHAPES[name]
    assert_agrees_with_hf(host.describe(copy.deepcopy(cfg)), hf_config(cfg))


def test_published_shape_facts(host):
    d = lambda name: host.describe(copy.deepcopy(SHAPES[name]))  # noqa: E731
    g3 = d("gemma-3-1b-like")
    assert [i for i, t in enumerate(g3.layer_types) if t == FULL] == [5, 11, 17, 23]
    assert g3.rope_for_layer(5).theta == 1e6 and g3.rope_for_layer(0).theta == 1e4
    assert g3.sliding_window == 512 and g3.num_kv_heads == 1 and g3.qk_norm
    assert d("gemma-2-2b-like").layer_types[:2] == (SLIDING, FULL)
    assert d("falcon-7b-like").num_kv_heads == 1 and d("falcon-7b-like").head_dim == 64
    assert d("falcon-40b-like").num_kv_heads == 128  # all query heads are cached
    assert d("falcon-rw-1b-like").positional == "alibi" and d("falcon-rw-1b-like").rope is None
    assert d("pythia-160m-like").rope.rotary_dim == 16
    phi3 = d("phi-3-mini-128k-like")
    assert phi3.rope.rope_type == "longrope" and phi3.rope.param("original_max_position_embeddings") == 4096
    assert phi3.attention_kind == "sliding" and phi3.sliding_window == 262144
    gptj = d("gpt-j-6b-like")
    assert gptj.head_dim == 256 and gptj.rope.rotary_dim == 64 and gptj.rope.interleaved
    assert d("command-r-like").rope.interleaved and d("command-r-like").rope.theta == 8e6
    assert d("olmo-2-7b-like").qk_norm and d("olmo-2-7b-like").extra("qk_norm_scope") == "projection"
    assert d("stablelm-2-1.6b-like").rope.rotary_dim == 16
