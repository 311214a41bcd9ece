"""Tiny random configs of any transformers model type, keeping the family's special features.

Start from the config class's defaults (which carry the family's layer types, windows, NoPE
pattern, MoE routing, MLA ranks, recurrent blocks), then shrink every size: hidden 64, 4 heads,
2 KV heads (1 for MQA, 4 for MHA defaults), head dim 16, small MoE and latent sizes, windows of
8 tokens, and just enough layers to keep every distinct layer kind of the default pattern.
Per-layer lists (``layer_types``, ``no_rope_layers``, ``kv_sharing_modes`` ...) are cut to the
same number of layers. Sub-configs (``text_config``, ``vision_config`` ...) are shrunk the same way.
"""

from __future__ import annotations

from contextlib import contextmanager

from kvbridge.models.hf_loader import config_for_model, model_from_config

#: attribute -> tiny value (applied when the default is a positive int)
SIZES = {
    key: size
    for size, keys in (
        (64, "hidden_size n_embd d_model n_embed word_embed_proj_dim"),
        (64, "adapter_in_dim adapter_out_dim adapter_input_size"),  # widths that must equal hidden
        (128, "intermediate_size n_inner ffn_dim decoder_ffn_dim ffn_hidden_size intermediate_size_mlp"),
        (128, "encoder_ffn_dim mamba_d_ssm"),
        (32, "moe_intermediate_size shared_expert_intermediate_size expert_intermediate_size moe_ffn_hidden_size"),
        (32, "shared_intermediate_size global_head_dim projection_dim"),
        (4, "num_attention_heads n_head num_heads decoder_attention_heads n_heads encoder_attention_heads"),
        (4, "swa_num_attention_heads linear_num_heads linear_num_value_heads"),
        (2, "linear_num_key_heads swa_num_key_value_heads index_n_heads"),
        (16, "head_dim attention_head_dim kv_channels dim_head swa_head_dim index_head_dim linear_head_dim"),
        (16, "linear_key_head_dim linear_value_head_dim mamba_d_head mamba_head_dim hidden_size_per_layer_input"),
        (4, "num_experts num_local_experts n_routed_experts moe_num_experts num_routed_experts"),
        (2, "num_experts_per_tok moe_topk top_k moe_k num_experts_per_token"),
        (1, "n_shared_experts num_shared_experts n_group topk_group num_expert_group"),
        (1, "first_k_dense_replace moe_layer_start_index"),
        (32, "kv_lora_rank"),
        (48, "q_lora_rank"),
        (8, "qk_rope_head_dim"),
        (16, "qk_nope_head_dim v_head_dim"),
        (8, "sliding_window attention_chunk_size window_size sliding_window_size"),
        (8, "mamba_d_state state_size ssm_state_size mamba_n_heads laurel_rank index_topk rotary_dim"),
        (4, "mamba_d_conv conv_kernel"),
        (1, "mamba_n_groups n_groups"),
        (2, "num_kv_shared_layers layer_group_size"),
        (256, "vocab_size_per_layer_input"),
        (3, "num_channels"),
    )
    for key in keys.split()
}
#: sizes only ever lowered (a default below the tiny value stays)
CAPPED = set("num_experts_per_tok top_k moe_topk moe_k num_experts_per_token n_group topk_group".split())
CAPPED |= {"first_k_dense_replace", "moe_layer_start_index"}
#: MoE sizes some config classes leave None by default (the model then cannot be built)
NONE_FILL = {"n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2}
KV_KEYS = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv", "num_key_value_groups")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers")
#: token ids that must stay inside the tiny vocabulary
TOKEN_KEYS = tuple(
    "bos_token_id eos_token_id pad_token_id sep_token_id decoder_start_token_id image_token_id image_token_index "
    "video_token_id boi_token_id eoi_token_id audio_token_id boa_token_id eoa_token_id".split()
)
VOCAB = 256
MAX_LAYERS = 8
#: Gemma3n's text decoder: two KV-sharing layers after a sliding/full pattern of five
_GEMMA3N_TEXT = {
    "num_kv_shared_layers": 2,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"],
}
#: per model type: overrides applied last (features the shrink would lose, or sizes that must agree)
OVERRIDES: dict[str, dict] = {
    "gemma3n": {"text_config": _GEMMA3N_TEXT},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1, 3]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]},
    "deepseek_v2": {"num_experts_per_tok": 2},
    "gemma3n_text": _GEMMA3N_TEXT,
    "dots3_note_text": {"head_dim": 24},  # its SWA layers need head_dim = qk_nope + qk_rope
    "dots3_note": {"text_config": {"head_dim": 24}},
    # the released config.json states rope_theta in attn_config too (the attention reads it there)
    "dbrx": {
        "attn_config": {"rope_theta": 500000.0, "clip_qkv": 8.0},
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    },
    "gemma4_assistant": {"text_config": {"num_kv_shared_layers": 6}},  # every layer reads shared K/V
    # one token stream per row; generate starts the delay pattern from decoder_start_token_id (= bos, as released)
    "musicgen": {"num_codebooks": 1, "decoder_start_token_id": 248},
    "musicgen_melody": {"num_codebooks": 1, "decoder_start_token_id": 248},
    "nemotron": {"num_key_value_heads": 2},
    # dory's to_dict writes every (attention, mlp) pair as two blocks and doubles the counts
    "dory": {
        "num_hidden_layers": 8,
        "n_input_layers": 2,
        "n_recurrent_layers": 4,
        "n_output_layers": 2,
        "layer_types": ["sliding_attention", "mlp"] * 3 + ["full_attention", "mlp"],
        "rope_parameters": None,
    },
    # M-RoPE per layer type; mrope_section must cover head_dim / 2 = 8 (text tokens: all 3 axes equal)
    "cohere_compass_text": {
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}
        }
    },
    # H_cycles x (L_cycles + 1) passes over a stack of num_layers_per_stack layers, one cache slot each
    "hrm_text": {"num_layers_per_stack": 2, "H_cycles": 2, "L_cycles": 1, "L_bp_cycles": [1], "num_hidden_layers": 8},
    "xlnet": {"d_head": 16},
    "xmod": {"default_language": "en_XX"},
    # axial position embeddings: the dims sum to hidden_size, the shape multiplies to the max positions
    "reformer": {
        "axial_pos_embds_dim": [32, 32],
        "axial_pos_shape": [8, 8],
        "max_position_embeddings": 64,
        "attn_layers": ["local", "lsh", "local", "lsh"],
        "local_attn_chunk_length": 8,
        "lsh_attn_chunk_length": 8,
        "num_hashes": 1,
        "num_buckets": 8,
    },
    # two hybrid layers sharing one transformer block (zamba ties every later one to the first)
    "zamba": {
        "num_hidden_layers": 5,
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "layers_block_type": None,
        "attention_hidden_size": 128,
        "attention_head_dim": 32,
        "mamba_dt_rank": 4,
        "n_mamba_heads": 2,
    },
    "zamba2": {
        "attention_hidden_size": 128,
        "attention_head_dim": 32,
        "mamba_headdim": 16,
        "n_mamba_heads": 8,
        "kv_channels": 16,
        "num_query_groups": 4,
        "num_key_value_heads": 4,
        "adapter_rank": 8,
    },
    "mimo_v2_flash": {"head_dim": 24},  # 0.334 x 24 = 8 rotary dims (x 16 would give an odd 5)
    "lfm2_moe": {"layer_types": ["conv", "full_attention", "conv", "full_attention"], "full_attn_idxs": [1, 3]},
    "lfm2": {"layer_types": ["conv", "full_attention", "conv", "full_attention"], "full_attn_idxs": [1, 3]},
    # QSA indexer sizes default to None (no indexer): 1 key head, 8-token budget in blocks of 2 (< the prompt); the
    # qwen4_exp wrapper's text_config gets it too
    "qwen4_exp_text": {
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 8,
        "indexer_compress_ratio": 2,
    },
}
#: per model type: keyword arguments for the config class when its own defaults fail validation
CONFIG_KWARGS: dict[str, dict] = {
    "gemma4_assistant": {"text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0}},
}
#: per model type: the config of the causal-LM class when it is a sub-config of the registry's config
CAUSAL_SUBCONFIG = {"musicgen": "decoder", "musicgen_melody": "decoder"}
#: per-layer sequences that may be rebuilt to keep every kind when no short prefix has them all
KIND_KEYS = ("layer_types", "layers_block_type")


def _tiny_layers(data: dict, old: int) -> int:
    """Enough layers to keep every distinct layer kind of the default pattern (2..MAX_LAYERS)."""
    for key in ("layer_types", "layers_block_type", "no_rope_layers", "kv_sharing_modes"):
        seq = data.get(key)
        if isinstance(seq, (list, str)) and len(seq) == old and seq:
            kinds = set(seq)
            for n in range(1, len(seq) + 1):
                if set(seq[:n]) == kinds:
                    return min(max(n, 4), MAX_LAYERS)
    return min(old, 4)


def _every_kind(seq: list, n: int) -> list:
    """``n`` entries holding every kind of ``seq`` (first appearance order, then the commonest kind)."""
    kinds = list(dict.fromkeys(seq))
    return kinds + [max(kinds, key=seq.count)] * max(0, n - len(kinds))


def shrink(data: dict, model_type: str = "", depth: int = 0) -> dict:
    out = dict(data)
    for key, value in data.items():
        if isinstance(value, dict) and value.get("model_type") and depth < 2:
            out[key] = shrink(value, value.get("model_type"), depth + 1)
    for key, tiny in NONE_FILL.items():
        if key in out and out[key] is None and any(k in out for k in ("n_routed_experts", "num_experts")):
            out[key] = tiny
    if "head_dim" in out and out["head_dim"] is None and "hidden_size" in out and "num_attention_heads" in out:
        out["head_dim"] = SIZES["head_dim"]  # = tiny hidden / heads; some models read it unconditionally
    for key, tiny in SIZES.items():
        value = out.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out[key] = min(value, tiny) if key in CAPPED else tiny
    heads = out.get("num_attention_heads") or out.get("n_head") or 4
    for key in KV_KEYS:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            old_heads = data.get("num_attention_heads") or data.get("n_head") or value
            out[key] = 1 if value == 1 else (heads if value == old_heads else 2)
    if isinstance(out.get("vocab_size"), int):
        out["vocab_size"] = VOCAB
        if isinstance(out.get("unpadded_vocab_size"), int):  # Inkling: the LM head's width (<= vocab_size)
            out["unpadded_vocab_size"] = VOCAB
        for key in TOKEN_KEYS:
            v = out.get(key)
            if isinstance(v, int) and v >= VOCAB - 8:
                out[key] = VOCAB - 8 + TOKEN_KEYS.index(key) % 8
            elif isinstance(v, list):
                out[key] = [x if not isinstance(x, int) or x < VOCAB - 8 else VOCAB - 1 for x in v]
    old = next((data[k] for k in LAYER_KEYS if isinstance(data.get(k), int) and data[k] > 0), None)
    if old:
        n = _tiny_layers(data, old)
        out.update({k: n for k in LAYER_KEYS if isinstance(data.get(k), int)})
        for key, value in data.items():
            per_layer = isinstance(value, list) or any(w in key for w in ("pattern", "layer", "block"))
            if per_layer and isinstance(value, (list, str)) and len(value) == old > 1 and key != "architectures":
                out[key] = value[:n]
                if key in KIND_KEYS and isinstance(value, list) and set(value[:n]) != set(value):
                    out[key] = _every_kind(value, n)
                    out.update({k: len(out[key]) for k in LAYER_KEYS if isinstance(data.get(k), int)})
        for key, value in data.items():  # per-layer overrides keyed by layer index: keep the tiny model's
            if isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
                out[key] = {
                    k: shrink(v) if isinstance(v, dict) else v
                    for k, v in value.items()
                    if int(k) < out.get("num_hidden_layers", n)
                }
        if data.get("kv_lora_rank") and "head_dim" in data:
            out["head_dim"] = out.get("qk_rope_head_dim", data["head_dim"])  # MLA: head_dim is the RoPE width
        if data.get("kv_lora_rank") and "qk_head_dim" in data:
            out["qk_head_dim"] = out.get("qk_rope_head_dim", 0) + out.get("qk_nope_head_dim", 0)
        if "is_decoder" in data:
            out["is_decoder"] = True  # BERT-style encoders run as causal decoders only with this flag
    if isinstance(out.get("max_window_layers"), int) and old:
        out["max_window_layers"] = min(out["max_window_layers"], max(1, (out.get("num_hidden_layers") or 2) // 2))
    out.update(OVERRIDES.get(model_type, {}) if depth else {})
    return out


def tiny_config_dict(model_type: str) -> dict:
    """A tiny config mapping of ``model_type`` (as ``PretrainedConfig.to_dict()`` writes it)."""
    base = config_for_model(model_type, **CONFIG_KWARGS.get(model_type, {})).to_dict()
    if model_type in CAUSAL_SUBCONFIG:
        base = base[CAUSAL_SUBCONFIG[model_type]]
    data = shrink(base, model_type)
    for key, value in OVERRIDES.get(model_type, {}).items():  # a sub-config override merges into the sub-config
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    data["model_type"] = base.get("model_type") if model_type in CAUSAL_SUBCONFIG else model_type
    for key in ("transformers_version", "architectures", "_name_or_path"):
        data.pop(key, None)
    return data


def build(data: dict, seed: int = 0):
    """The tiny model (float32, eval mode) of a config mapping."""
    import torch

    obj = config_for_model(data["model_type"], **{k: v for k, v in data.items() if k != "model_type"})
    torch.manual_seed(seed)
    try:
        return _from_config(obj)
    except ImportError as exc:
        if "timm" not in str(exc):
            raise
    with _timm_towers_left_out():  # gemma3n's vision tower is a timm model; the text cache never meets it
        model = _from_config(obj)
    model.kvbridge_left_out = "vision tower not built (timm not installed); text-only inputs never reach it"
    return model


def _from_config(obj):
    import torch

    try:
        return model_from_config(obj, dtype=torch.float32).eval()
    except ValueError:  # a decoder sub-config (musicgen_decoder): the registry class that takes it
        cls = _causal_class_of(type(obj))
        if cls is None:
            raise
        return cls._from_config(obj, dtype=torch.float32).eval()


@contextmanager
def _timm_towers_left_out():
    """``AutoModel.from_config`` of a timm sub-config gives an empty module (no weights, never called)."""
    from torch import nn
    from transformers import AutoModel
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    original = AutoModel.__dict__.get("from_config")
    inherited = AutoModel.from_config

    def from_config(cls, config, **kwargs):
        timm = MODEL_MAPPING.get(type(config), nn.Module).__name__.startswith("TimmWrapper")
        return nn.Module() if timm else inherited(config, **kwargs)

    AutoModel.from_config = classmethod(from_config)
    try:
        yield
    finally:
        if original is None:
            del AutoModel.from_config
        else:
            AutoModel.from_config = original


def _causal_class_of(config_class):
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        cls = getattr(transformers, name, None)
        if cls is not None and getattr(cls, "config_class", None) is config_class:
            return cls
    return None
