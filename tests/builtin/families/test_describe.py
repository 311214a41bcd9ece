"""describe() of every built-in family against transformers' own reading of the same config.

Config level only (no model is built here; see test_models.py for cache geometry).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from family_oracle import ADAPTERS, TINY, TINY_IDS, assert_agrees_with_hf, hf_config, tiny

from kvbridge.errors import ConfigError, UnsupportedModelError
from kvbridge.spec import FULL, SLIDING, ModelSpec

FAMILIES = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi",
    "phi3",
    "stablelm",
    "gpt_neox",
    "gptj",
    "cohere",
    "falcon",
    "gpt2",
    "olmo2",
]
SUPPORTED_FIXTURES = [
    "Qwen__Qwen2-1.5B-Instruct",
    "Qwen__Qwen2.5-0.5B",
    "Qwen__Qwen2.5-1.5B-Instruct",
    "Qwen__Qwen3-4B",
    "meta-llama__Llama-2-7b-chat-hf",
    "meta-llama__Llama-3.2-1B",
    "meta-llama__Llama-3.2-3B-Instruct",
    "microsoft__phi-2",
    "mistralai__Mistral-7B-v0.1",
    "openai-community__gpt2",
]


# -- registration --------------------------------------------------------------------------------
def test_every_family_is_registered(host):
    assert sorted(a.name for a in host.adapters()) == sorted(FAMILIES)
    for name in FAMILIES:
        adapter = host.adapter_for({"model_type": name})
        assert adapter.name == name and name in adapter.model_types
        assert adapter.description


def test_plugin_module_imports_no_torch():
    code = (
        "import sys, kvbridge.builtin.families as f\n"
        "adapters = f.builtin_adapters()\n"
        "[a.describe(a.tiny_config()) for a in adapters]\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", FAMILIES)
def test_tiny_config_is_first_variant_and_small(name):
    adapter = ADAPTERS[name]
    variants = adapter.tiny_configs()
    assert adapter.tiny_config() == next(iter(variants.values()))
    for cfg in variants.values():
        assert cfg["model_type"] in adapter.model_types
        spec = adapter.describe(cfg)
        assert 2 <= spec.num_layers <= 4 and spec.hidden_size <= 64 and spec.vocab_size <= 256


# -- agreement with transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("name,variant", TINY, ids=TINY_IDS)
def test_tiny_configs_agree_with_transformers(name, variant):
    cfg = tiny(name, variant)
    spec = ADAPTERS[name].describe(cfg)
    assert spec.family == name
    assert_agrees_with_hf(spec, hf_config(cfg))


@pytest.mark.parametrize("name,variant", TINY, ids=TINY_IDS)
def test_describe_of_hf_to_dict_matches_raw(name, variant):
    """spec_of(model) describes model.config.to_dict(): the 5.x form must give the same spec."""
    cfg = tiny(name, variant)
    adapter = ADAPTERS[name]
    assert adapter.describe(hf_config(cfg).to_dict()) == adapter.describe(cfg)


@pytest.mark.parametrize("name,variant", TINY, ids=TINY_IDS)
def test_spec_serialises(name, variant):
    spec = ADAPTERS[name].describe(tiny(name, variant))
    again = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and again.fingerprint() == spec.fingerprint()
    hash(spec)  # frozen all the way down


def test_describe_does_not_mutate_its_input():
    for name, variant in TINY:
        cfg = tiny(name, variant)
        before = copy.deepcopy(cfg)
        ADAPTERS[name].describe(cfg)
        assert cfg == before, name


@pytest.mark.parametrize("folder", SUPPORTED_FIXTURES)
def test_real_configs_agree_with_transformers(fixture_configs, host, folder):
    cfg = fixture_configs[folder]
    spec = host.describe(cfg)
    assert_agrees_with_hf(spec, hf_config(cfg))
    assert host.adapter_for(cfg).describe(hf_config(cfg).to_dict()) == spec


def test_all_fixture_folders_are_covered(fixture_configs):
    assert set(fixture_configs) == set(SUPPORTED_FIXTURES) | {"deepseek-ai__DeepSeek-V2-Lite"}


# -- facts a careful reader takes from the real configs ------------------------------------------------------
def test_llama_32_uses_llama3_rope(fixture_configs, host):
    for folder in ("meta-llama__Llama-3.2-1B", "meta-llama__Llama-3.2-3B-Instruct"):
        spec = host.describe(fixture_configs[folder])
        assert spec.rope.rope_type == "llama3" and spec.rope.theta == 500000.0
        assert spec.rope.param("factor") == 32.0
        assert spec.rope.param("low_freq_factor") == 1.0 and spec.rope.param("high_freq_factor") == 4.0
        assert spec.rope.param("original_max_position_embeddings") == 8192
        assert spec.max_position_embeddings == 131072 and spec.num_kv_heads == 8
        assert spec.dtype == "bfloat16"
    assert host.describe(fixture_configs["meta-llama__Llama-3.2-1B"]).head_dim == 64
    assert host.describe(fixture_configs["meta-llama__Llama-3.2-3B-Instruct"]).head_dim == 128


def test_llama2_is_plain_mha_rope(fixture_configs, host):
    spec = host.describe(fixture_configs["meta-llama__Llama-2-7b-chat-hf"])
    assert spec.rope.rope_type == "default" and spec.rope.theta == 10000.0  # no rope_theta key: default
    assert spec.num_kv_heads == spec.num_attention_heads == 32 and spec.head_dim == 128
    assert spec.dtype == "float16" and spec.attention_kind == "full"


def test_mistral_slides_every_layer_over_4096(fixture_configs, host):
    spec = host.describe(fixture_configs["mistralai__Mistral-7B-v0.1"])
    assert spec.sliding_window == 4096
    assert spec.layer_types == (SLIDING,) * 32 and spec.attention_kind == "sliding"
    assert spec.num_kv_heads == 8 and spec.kv_group_size == 4


def test_phi2_rotates_40_percent(fixture_configs, host):
    spec = host.describe(fixture_configs["microsoft__phi-2"])
    assert spec.rope.partial_factor == 0.4 and spec.head_dim == 80 and spec.rope.rotary_dim == 32
    assert spec.qk_norm is False and spec.num_kv_heads == 32


def test_gpt2_has_absolute_positions(fixture_configs, host):
    spec = host.describe(fixture_configs["openai-community__gpt2"])
    assert spec.positional == "absolute" and spec.rope is None and spec.rope_for_layer(0) is None
    assert (spec.num_layers, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (12, 12, 12, 64)
    assert spec.max_position_embeddings == 1024 and spec.dtype == "float32"  # no dtype key


def test_qwen2_kv_heads_and_no_sliding(fixture_configs, host):
    for folder, layers, heads in (
        ("Qwen__Qwen2-1.5B-Instruct", 28, 12),
        ("Qwen__Qwen2.5-0.5B", 24, 14),
        ("Qwen__Qwen2.5-1.5B-Instruct", 28, 12),
    ):
        spec = host.describe(fixture_configs[folder])
        assert (spec.num_layers, spec.num_attention_heads, spec.num_kv_heads) == (layers, heads, 2)
        # sliding_window is 32768 in the file but use_sliding_window is false: no sliding layer
        assert spec.sliding_window is None and spec.layer_types == (FULL,) * layers
        assert spec.rope.theta == 1e6


def test_qwen3_has_qk_norm_and_explicit_head_dim(fixture_configs, host):
    spec = host.describe(fixture_configs["Qwen__Qwen3-4B"])
    assert spec.qk_norm is True and spec.head_dim == 128  # 2560 / 32 would be 80
    assert spec.num_kv_heads == 8 and spec.sliding_window is None and spec.rope.theta == 1e6


def test_deepseek_v2_mla_latent_cache(fixture_configs, host):
    """DeepSeek-V2-Lite (MLA): the generic adapter reports the latent cache transformers keeps."""
    spec = host.describe(fixture_configs["deepseek-ai__DeepSeek-V2-Lite"])
    assert spec.cache_format == "mla" and spec.dtype == "bfloat16" and spec.num_layers == 27
    assert dict(spec.latent) == {
        "kv_lora_rank": 512,
        "q_lora_rank": 0,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }
    assert (spec.num_kv_heads, spec.key_dim_of(0), spec.value_dim_of(0)) == (1, 512, 64)
    assert spec.rope.rope_type == "yarn" and spec.rope.param("factor") == 40 and spec.rope.interleaved


def test_mamba_is_refused_as_having_no_kv_cache(host):
    with pytest.raises(UnsupportedModelError, match="no attention KV cache"):
        host.describe({"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24})


# -- legacy keys and defaults, each checked against transformers -------------------------------------------------
LEGACY_CASES = {
    "rope_scaling_old_type_key": {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_theta": 50000.0,
        "max_position_embeddings": 64,
        "rope_scaling": {"type": "dynamic", "factor": 4.0},
    },
    "rope_parameters_5x": {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 20000.0},
    },
    "neox_rotary_pct_base": {
        "model_type": "gpt_neox",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rotary_pct": 0.5,
        "rotary_emb_base": 500,
    },
    # GPTNeoXConfig ignores a top-level rope_theta / partial_rotary_factor (5.24): so must we
    "neox_ignores_top_level_rope_theta": {
        "model_type": "gpt_neox",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_theta": 5000.0,
        "partial_rotary_factor": 0.5,
    },
    "phi_default_partial": {"model_type": "phi", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4},
    "phi3_top_level_original_max": {
        "model_type": "phi3",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "original_max_position_embeddings": 16,
        "rope_scaling": {
            "type": "longrope",
            "original_max_position_embeddings": 999,
            "short_factor": [1.0] * 8,
            "long_factor": [2.0] * 8,
        },
    },
    "phi3_su_means_longrope": {
        "model_type": "phi3",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "original_max_position_embeddings": 16,
        "rope_scaling": {
            "type": "su",
            "original_max_position_embeddings": 16,
            "short_factor": [1.0] * 8,
            "long_factor": [2.0] * 8,
        },
    },
    "gemma3_legacy_local_base": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 7,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "rope_theta": 1e6,
        "rope_local_base_freq": 10000.0,
        "sliding_window": 512,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    },
    "gemma3_bidirectional_window": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 16,
        "sliding_window": 512,
        "use_bidirectional_attention": True,
    },
    "gemma3_defaults": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 12,
        "hidden_size": 64,
        "num_attention_heads": 4,
    },
    "gemma2_defaults": {"model_type": "gemma2", "num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4},
    "gemma_defaults": {
        "model_type": "gemma",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 16,
        "torch_dtype": "bfloat16",
    },
    "gptj_rotary_dim": {"model_type": "gptj", "n_layer": 2, "n_embd": 96, "n_head": 4, "rotary_dim": 6},
    "gptj_alias_names": {
        "model_type": "gptj",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 32,
        "rotary_dim": 4,
    },
    "gpt2_defaults": {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64},
    "mistral_defaults": {"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 8},
    "mistral_null_window": {
        "model_type": "mistral",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 8,
        "sliding_window": None,
    },
    "qwen2_max_window_layers_zero": {
        "model_type": "qwen2",
        "num_hidden_layers": 3,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "use_sliding_window": True,
        "sliding_window": 8,
        "max_window_layers": 0,
    },
    "qwen2_explicit_layer_types": {
        "model_type": "qwen2",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "use_sliding_window": True,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "qwen3_default_head_dim": {
        "model_type": "qwen3",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "falcon_legacy_n_embed": {"model_type": "falcon", "num_hidden_layers": 2, "n_embed": 64, "num_attention_heads": 4},
    "falcon_rw_alibi": {
        "model_type": "falcon",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "alibi": True,
        "multi_query": False,
    },
    "cohere_default_theta": {
        "model_type": "cohere",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "use_qk_norm": True,
    },
    "stablelm_defaults": {
        "model_type": "stablelm",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 32,
    },
    "olmo2_dtype_key": {
        "model_type": "olmo2",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "dtype": "bfloat16",
        "torch_dtype": "float16",
    },
}


@pytest.mark.parametrize("case", sorted(LEGACY_CASES))
def test_legacy_keys_and_defaults_agree_with_transformers(host, case):
    cfg = LEGACY_CASES[case]
    spec = host.describe(copy.deepcopy(cfg))
    assert_agrees_with_hf(spec, hf_config(cfg))


def test_legacy_facts(host):
    d = lambda case: host.describe(copy.deepcopy(LEGACY_CASES[case]))  # noqa: E731
    assert d("rope_scaling_old_type_key").rope.rope_type == "dynamic"
    assert d("neox_rotary_pct_base").rope.to_dict()["theta"] == 500.0
    assert d("neox_rotary_pct_base").rope.rotary_dim == 8
    assert d("neox_ignores_top_level_rope_theta").rope.theta == 10000.0
    assert d("neox_ignores_top_level_rope_theta").rope.partial_factor == 0.25
    assert d("phi_default_partial").rope.partial_factor == 0.5
    phi3 = d("phi3_top_level_original_max").rope
    assert phi3.rope_type == "longrope" and phi3.param("original_max_position_embeddings") == 16
    assert d("phi3_su_means_longrope").rope.rope_type == "longrope"
    g3 = d("gemma3_legacy_local_base")
    assert g3.layer_types == (SLIDING,) * 5 + (FULL,) + (SLIDING,)
    assert g3.rope_for_layer(5).rope_type == "linear" and g3.rope_for_layer(5).theta == 1e6
    assert g3.rope_for_layer(0).rope_type == "default" and g3.rope_for_layer(0).theta == 1e4
    assert d("gemma3_bidirectional_window").sliding_window == 257
    assert d("gemma3_defaults").head_dim == 256 and d("gemma3_defaults").sliding_window == 4096
    assert d("gemma2_defaults").layer_types == (SLIDING, FULL, SLIDING)
    assert d("gemma_defaults").dtype == "bfloat16" and d("gemma_defaults").head_dim == 256
    gptj = d("gptj_rotary_dim")
    assert gptj.head_dim == 24 and gptj.rope.rotary_dim == 6 and gptj.rope.interleaved
    assert d("gptj_alias_names").max_position_embeddings == 32
    assert d("mistral_defaults").sliding_window == 4096 and d("mistral_defaults").num_kv_heads == 8
    assert d("mistral_null_window").attention_kind == "full"
    assert d("qwen2_max_window_layers_zero").layer_types == (SLIDING,) * 3
    assert d("qwen2_explicit_layer_types").layer_types == (SLIDING, FULL)
    assert d("qwen3_default_head_dim").head_dim == 128
    assert d("falcon_legacy_n_embed").hidden_size == 64 and d("falcon_legacy_n_embed").num_kv_heads == 1
    assert d("falcon_rw_alibi").positional == "alibi" and d("falcon_rw_alibi").num_kv_heads == 4
    assert d("cohere_default_theta").rope.theta == 500000.0 and d("cohere_default_theta").qk_norm
    assert d("olmo2_dtype_key").dtype == "bfloat16"


def test_falcon_cache_head_rules():
    falcon = ADAPTERS["falcon"]
    base = {"model_type": "falcon", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 8}
    assert falcon.describe({**base, "new_decoder_architecture": True, "num_kv_heads": 2}).num_kv_heads == 8
    assert falcon.describe({**base, "multi_query": True}).num_kv_heads == 1
    assert falcon.describe(base).num_kv_heads == 1  # multi_query defaults to true
    assert falcon.describe({**base, "multi_query": False}).num_kv_heads == 8
    spec = falcon.describe({**base, "new_decoder_architecture": True, "num_kv_heads": 2})
    assert spec.extra("num_kv_heads") == 2 and spec.extra("new_decoder_architecture") is True


# -- bad input: one line naming the field ---------------------------------------------------------------------------
BAD = [
    ("llama", "num_attention_heads", None, "num_attention_heads"),
    ("llama", "num_hidden_layers", -2, "num_hidden_layers"),
    ("llama", "num_hidden_layers", 2.0, "num_hidden_layers"),
    ("llama", "num_hidden_layers", True, "num_hidden_layers"),
    ("llama", "hidden_size", "64", "hidden_size"),
    ("llama", "num_key_value_heads", 3, "num_key_value_heads"),
    ("llama", "num_key_value_heads", 0, "num_key_value_heads"),
    ("llama", "head_dim", -16, "head_dim"),
    ("llama", "vocab_size", 0, "vocab_size"),
    ("llama", "max_position_embeddings", "long", "max_position_embeddings"),
    ("llama", "rope_scaling", "yarn", "rope_scaling"),
    ("llama", "rope_theta", "ten thousand", "rope_theta"),
    ("phi", "partial_rotary_factor", 1.5, "partial_rotary_factor"),
    ("gpt2", "n_layer", None, "n_layer"),
    ("gpt2", "n_head", 0, "n_head"),
    ("gptj", "rotary_dim", 7, "rotary_dim"),
    ("gptj", "rotary_dim", 64, "rotary_dim"),
    ("gemma2", "layer_types", ["sliding_attention"], "layer_types"),
    (
        "gemma2",
        "layer_types",
        ["sliding_attention", "chunked_attention", "full_attention", "full_attention"],
        "layer_types",
    ),
    ("gemma3_text", "sliding_window_pattern", 0, "sliding_window_pattern"),
    ("gemma3_text", "rope_parameters", ["x"], "rope_parameters"),
    ("mistral", "sliding_window", -1, "sliding_window"),
    ("qwen2", "max_window_layers", -1, "max_window_layers"),
    ("phi3", "rope_scaling", {"rope_type": "linear", "factor": 2.0}, "rope"),
    ("falcon", "num_kv_heads", 0, "num_kv_heads"),
]


@pytest.mark.parametrize("family,field,value,named", BAD, ids=[f"{b[0]}-{b[1]}-{b[2]!r}" for b in BAD])
def test_bad_input_raises_one_line_config_error(family, field, value, named):
    cfg = ADAPTERS[family].tiny_config()
    if family == "falcon":
        cfg["multi_query"], cfg["new_decoder_architecture"] = False, False
    if value is None:
        cfg.pop(field, None)
    else:
        cfg[field] = value
    with pytest.raises(ConfigError) as err:
        ADAPTERS[family].describe(cfg)
    message = str(err.value)
    assert named in message and "\n" not in message and "fix:" in message


def test_missing_heads_through_the_host(host):
    cfg = ADAPTERS["qwen3"].tiny_config()
    del cfg["num_attention_heads"]
    with pytest.raises(ConfigError, match="num_attention_heads"):
        host.describe(cfg)


def test_negative_layers_through_the_host(host):
    cfg = {**ADAPTERS["mistral"].tiny_config(), "num_hidden_layers": -1}
    with pytest.raises(ConfigError, match="num_hidden_layers.*positive integer"):
        host.describe(cfg)


def test_not_a_mapping_is_a_config_error():
    with pytest.raises(ConfigError, match="config mapping"):
        ADAPTERS["llama"].describe(["model_type", "llama"])
