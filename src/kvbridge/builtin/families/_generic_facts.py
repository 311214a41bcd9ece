"""Facts about transformers families that their config class does not state.

Each entry is a property of the family's modeling code (how it rotates keys, which layers skip
RoPE, how many heads it caches); ``kvbridge conformance`` checks every one against the cache the
model really produces, so a wrong entry shows up as a wrong fact in the sweep. Pure python.
"""

from __future__ import annotations

from typing import Any

#: the fix line of a refusal
REFUSED_FIX = "kvbridge moves caches it can represent exactly; see docs/supported-models.md"

#: model types refused before reading the config, with the reason (what differs in the cache)
REFUSED: dict[str, str] = {
    "mamba": "no attention KV cache (recurrent/state-space model)",
    "mamba2": "no attention KV cache (recurrent/state-space model)",
    "falcon_mamba": "no attention KV cache (recurrent/state-space model)",
    "rwkv": "no attention KV cache (recurrent/state-space model)",
    "xlstm": "no attention KV cache (recurrent/state-space model)",
    "recurrent_gemma": "no attention KV cache of the usual kind (recurrent blocks + local attention in its own cache)",
}

#: families that rotate interleaved pairs (2i, 2i+1) instead of half-split
INTERLEAVED = frozenset({"glm", "glm4", "cohere2", "cohere2_moe", "cohere_compass_text", "gptj", "codegen",
                         "cohere", "ernie4_5", "ernie4_5_moe"})

#: families whose full-attention layers use no positional encoding (RoPE only on sliding layers)
NOPE_ON_FULL = frozenset({"cohere2", "cohere2_moe", "afmoe", "beam", "flint", "laguna", "dory"})
#: the same, but only when the model has sliding layers at all (``sliding_window is None or is_sliding``)
NOPE_ON_FULL_IF_SLIDING = frozenset({"exaone4", "exaone4_5", "exaone_moe", "kolibri1"})

#: families where KV heads need not divide query heads (no GQA grouping assumption in the cache)
UNGROUPED_OK: frozenset = frozenset()

#: families with learned absolute position embeddings / ALiBi (no ``rope_parameters``)
ALIBI = frozenset({"bloom", "mpt"})


def positional(model_type: str, text: Any) -> str:
    if model_type in ALIBI or getattr(text, "alibi", False):
        return "alibi"
    if getattr(text, "rope_parameters", None):
        return "rope"
    if getattr(text, "position_embedding_type", "absolute") not in ("absolute", None):
        return "none"
    return "absolute"


#: MLA families that rotate the cached RoPE key with a complex multiply (interleaved pairs)
MLA_COMPLEX = frozenset({"deepseek_v2"})


def interleaved(model_type: str, text: Any) -> bool:
    if getattr(text, "kv_lora_rank", None):
        # MLA: DeepSeek-V3 style ``rope_interleave`` (pairs 2i, 2i+1), or V2's complex rotation
        return bool(getattr(text, "rope_interleave", False)) or model_type in MLA_COMPLEX
    return model_type in INTERLEAVED


def nope_layers(model_type: str, text: Any, kinds: list) -> tuple:
    """Layers whose keys carry no RoPE."""
    from kvbridge.check.spec import CHUNKED, FULL, SLIDING

    flags = getattr(text, "no_rope_layers", None)
    if flags:  # SmolLM3 / Llama 4: 1 = the layer uses RoPE, 0 = NoPE
        return tuple(i for i, f in enumerate(flags) if not f and i < len(kinds)
                     and kinds[i] in (FULL, SLIDING, CHUNKED))
    if model_type in NOPE_ON_FULL or (model_type in NOPE_ON_FULL_IF_SLIDING and SLIDING in kinds):
        return tuple(i for i, k in enumerate(kinds) if k == FULL)
    return ()


def cached_kv_heads(model_type: str, layer_cfg: Any, heads: int) -> int:
    """KV heads one layer stores in the cache."""
    from kvbridge.builtin.families.generic import _layer_attr

    if _layer_attr(layer_cfg, "kv_lora_rank", None):  # MLA: one latent "head" per token
        return 1
    if _layer_attr(layer_cfg, "multi_query", False):
        return 1
    kv = _layer_attr(layer_cfg, "num_key_value_heads", None) or _layer_attr(layer_cfg, "num_kv_heads", None)
    return int(kv or heads)


def key_head_dim(model_type: str, layer_cfg: Any, heads: int, hidden: int) -> int:
    from kvbridge.builtin.families.generic import _layer_attr

    if _layer_attr(layer_cfg, "kv_lora_rank", None):  # MLA: the "keys" slot holds the compressed latent
        return int(_layer_attr(layer_cfg, "kv_lora_rank"))
    hd = _layer_attr(layer_cfg, "head_dim", None) or _layer_attr(layer_cfg, "dim_head", None)
    if hd:
        return int(hd)
    return int(_layer_attr(layer_cfg, "hidden_size", hidden)) // heads


def mla_sizes(text: Any) -> dict:
    """MLA latent sizes, {} for other attention."""
    from kvbridge.builtin.families.generic import _layer_attr

    rank = _layer_attr(text, "kv_lora_rank", None)
    if not rank:
        return {}
    return {k: int(_layer_attr(text, k, 0) or 0) for k in
            ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
