"""The generic adapter: published configs of families without a family file, described right.

The config dicts below hold the geometry fields of the published ``config.json`` files (values
copied from them, not the files); every expected fact is what the transformers modeling code
caches for that config (checked on tiny models by ``kvbridge conformance``).
"""

from __future__ import annotations

import pytest

from kvbridge.spec import CHUNKED, FULL, LINEAR, SHARED, SLIDING
from kvbridge.errors import UnsupportedModelError
from kvbridge.plugins import make_host

HOST = make_host(entry_points=False)

QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "use_sliding_window": False,
    "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}
GPT_OSS_20B = {
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 2880,
    "num_local_experts": 32,
    "experts_per_token": 4,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "rope_theta": 150000,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    "vocab_size": 201088,
    "torch_dtype": "bfloat16",
}
GEMMA3_27B = {
    "model_type": "gemma3",
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 5376,
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "intermediate_size": 21504,
        "query_pre_attn_scalar": 168,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "vocab_size": 262208,
    },
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "vocab_size": 129280,
    "torch_dtype": "bfloat16",
}
LLAMA4_SCOUT_TEXT = {
    "model_type": "llama4_text",
    "hidden_size": 5120,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_local_experts": 16,
    "attention_chunk_size": 8192,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 16.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
    },
    "max_position_embeddings": 10485760,
    "vocab_size": 202048,
    "use_qk_norm": True,
    "torch_dtype": "bfloat16",
}


def describe(config):
    return HOST.adapter_for(dict(config)).describe(dict(config))


def test_qwen3_moe_is_ordinary_attention_kv():
    spec = describe(QWEN3_30B_A3B)
    assert (spec.family, spec.num_layers, spec.num_kv_heads, spec.head_dim) == ("generic", 48, 4, 128)
    assert spec.rope.theta == 1e6 and spec.attention_kind == "full" and spec.dtype == "bfloat16"
    assert spec.cache_format == "kv" and spec.uniform_kv


def test_gpt_oss_alternates_sliding_and_full_with_yarn():
    spec = describe(GPT_OSS_20B)
    assert spec.layer_types == (SLIDING, FULL) * 12 and spec.sliding_window == 128
    assert [spec.window_of(i) for i in (0, 1)] == [128, None]
    assert spec.rope.rope_type == "yarn" and spec.rope.param("factor") == 32.0 and spec.rope.theta == 150000
    assert spec.rope.param("original_max_position_embeddings") == 4096
    assert (spec.num_kv_heads, spec.head_dim, spec.dtype) == (8, 64, "bfloat16")


def test_gemma3_wrapper_keeps_the_wrapper_dtype_and_uses_the_family_file():
    spec = describe(GEMMA3_27B)
    assert spec.family == "gemma3_text" and spec.dtype == "bfloat16"
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.sliding_window) == (62, 16, 128, 1024)
    from kvbridge.cli.options import kv_bytes_per_token

    assert kv_bytes_per_token(spec) == 2 * 62 * 16 * 128 * 2  # bf16: half of what float32 would claim


def test_deepseek_v3_reports_the_latent_cache():
    spec = describe(DEEPSEEK_V3)
    assert spec.cache_format == "mla" and dict(spec.latent)["kv_lora_rank"] == 512
    # the cache holds the latent (1 x 512, position-free) and the shared RoPE key (1 x 64) per token
    assert (spec.num_kv_heads, spec.key_dim_of(0), spec.value_dim_of(0)) == (1, 512, 64)
    # rope_interleave pairs (2i, 2i+1) of the input, but transformers caches the rotated key de-interleaved
    assert spec.rope.head_dim == 64 and spec.rope.rope_type == "yarn" and not spec.rope.interleaved
    from kvbridge.cli.options import kv_bytes_per_token

    assert kv_bytes_per_token(spec) == 61 * (512 + 64) * 2


def test_llama4_chunked_layers_and_nope_layers():
    spec = describe(LLAMA4_SCOUT_TEXT)
    assert spec.attention_chunk_size == 8192
    # every 4th layer is a NoPE full-attention layer; the others chunked RoPE layers
    assert spec.nope_layers == tuple(range(3, 48, 4))
    assert all(spec.layer_type(i) == (FULL if i % 4 == 3 else CHUNKED) for i in range(48))
    assert spec.window_of(0) == 8192 and spec.window_of(3) is None
    assert spec.rope_for_layer(3) is None and spec.rope_for_layer(0).rope_type == "llama3"
    assert spec.positional_of(3) == "none" and spec.positional_of(0) == "rope"


def test_smollm3_and_cohere2_nope_layers():
    smol = describe({"model_type": "smollm3", "num_hidden_layers": 8, "no_rope_layer_interval": 4})
    assert smol.nope_layers == (3, 7)
    cohere2 = describe({"model_type": "cohere2", "num_hidden_layers": 8, "sliding_window_pattern": 4})
    assert cohere2.nope_layers == tuple(i for i in range(8) if cohere2.layer_type(i) == FULL)
    assert cohere2.rope.interleaved


def test_gemma3n_shared_kv_layers_have_no_cache_of_their_own():
    spec = describe({"model_type": "gemma3n_text"})
    shared = spec.kv_shared_layers
    assert len(shared) == 15 and shared == tuple(range(20, 35))
    assert all(spec.layer_type(i) == SHARED and spec.kv_heads_of(i) == 0 for i in shared)
    assert len(spec.kv_layers) == 20


def test_hybrid_recurrent_layers_are_listed():
    spec = describe({"model_type": "qwen3_next"})
    assert spec.cache_format == "hybrid"
    assert spec.state_layers == spec.no_kv_layers == tuple(i for i in range(48) if i % 4 != 3)
    assert all(spec.layer_type(i) == LINEAR for i in spec.state_layers)
    assert spec.kv_layers == tuple(range(3, 48, 4))


@pytest.mark.parametrize("model_type", ["mamba", "mamba2", "rwkv", "xlstm", "falcon_mamba"])
def test_pure_recurrent_models_have_no_attention_kv_cache(model_type):
    with pytest.raises(UnsupportedModelError, match="no attention KV cache") as info:
        describe({"model_type": model_type})
    assert "did you mean" not in str(info.value)


def test_did_you_mean_only_for_close_names():
    with pytest.raises(UnsupportedModelError) as info:
        describe({"model_type": "lama"})
    assert "did you mean llama" in str(info.value)
    with pytest.raises(UnsupportedModelError) as info:
        describe({"model_type": "totally_new_arch"})
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize(
    "model_type", ["exaone", "internlm3", "mixtral", "granite", "olmo3", "starcoder2", "gpt_bigcode", "glm4"]
)
def test_llama_style_families_without_a_family_file_get_the_generic_adapter(model_type):
    spec = describe({"model_type": model_type})
    assert spec.family == "generic" and spec.num_layers > 0 and spec.num_kv_heads > 0


def test_spec_round_trips_the_per_layer_fields():
    from kvbridge.spec import ModelSpec

    for config in (LLAMA4_SCOUT_TEXT, DEEPSEEK_V3, {"model_type": "qwen3_next"}, {"model_type": "gemma3n_text"}):
        spec = describe(config)
        assert ModelSpec.from_dict(spec.to_dict()) == spec
