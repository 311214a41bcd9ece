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
    "openai-gpt": "the model keeps no KV cache (generation recomputes the whole prefix)",
    "mllama": "its cross-attention layers cache image K/V that the text tokens do not produce",
    "moshi": "text and audio streams share its cache; a continuation also needs the audio codebooks",
    "minimax": "its own MiniMaxCache keeps lightning-attention state in place of K/V on linear layers, outside the"
               " per-layer cache contract",
    "xlm": "it keeps its cache in its own per-layer dict, not a transformers Cache",
    "whisper": "its decoder also caches cross-attention K/V of the audio encoder (an encoder-decoder cache)",
    "xlnet": "it carries `mems` (each layer's input hidden states, turned into K/V again every step), not a K/V cache",
    "reformer": "its own ReformerDynamicCache keeps hidden states and LSH buckets, not K/V",
    "gemma4_assistant": "a draft model with no cache of its own: its layers attend to the target model's K/V"
                        " (shared_kv_states)",
    "gemma4_unified_assistant": "a draft model with no cache of its own: its layers attend to the target model's"
                                " K/V (shared_kv_states)",
    "cpmant": "its cache holds `prompt_length` learned prompt positions ahead of the tokens (cached length != tokens)",
}

#: transformers cache layer kinds kvbridge refuses, with what differs in them
LAYER_REFUSALS = {
    "indexed_attention": "sparse attention caches indexer keys beside K/V, which kvbridge does not carry",
    "heavily_compressed_attention": "its cache holds compressed blocks of tokens, not per-token K/V",
    "compressed_sparse_attention": "its cache holds compressed blocks of tokens, not per-token K/V",
}

#: families that rotate interleaved pairs (2i, 2i+1) instead of half-split
INTERLEAVED = frozenset({"glm", "glm4", "cohere2", "cohere2_moe", "gptj", "codegen",
                         "cohere", "ernie4_5", "ernie4_5_moe", "helium", "llama4", "llama4_text"})

#: families whose full-attention layers use no positional encoding (RoPE only on sliding layers)
NOPE_ON_FULL = frozenset({"cohere2", "cohere2_moe", "afmoe", "beam", "flint", "lara_mini"})
#: the same, but only when the model has sliding layers at all (``sliding_window is None or is_sliding``)
NOPE_ON_FULL_IF_SLIDING = frozenset({"exaone4", "exaone4_5", "exaone_moe", "kolibri1"})

def cache_slots(text: Any, n_layers: int) -> list:
    """The model layer behind each cache layer. Dory's ``per_loop`` mode: every loop after the first
    appends its own copy of the recurrent layers' cache (``DoryModel.forward``) after the model's layers."""
    loops = int(getattr(text, "n_recurrent_loops", 1) or 1)
    if getattr(text, "recurrent_kv_cache_mode", None) != "per_loop" or loops < 2:
        return list(range(n_layers))
    start, rec = int(text.n_input_layers), int(text.n_recurrent_layers)
    return list(range(n_layers)) + [start + j for _ in range(loops - 1) for j in range(rec)]


#: families where KV heads need not divide query heads (no GQA grouping assumption in the cache)
UNGROUPED_OK: frozenset = frozenset()

#: families whose rotate_half is sign-flipped: keys rotate by -angle (RopeSpec scaling ``direction`` = -1)
NEGATIVE_ROTATION = frozenset({"nanochat"})

#: families whose attention applies RoPE only when a config flag is set (Zamba2: ``use_mem_rope``)
ROPE_FLAG = {"zamba2": "use_mem_rope"}

#: families with learned absolute position embeddings / ALiBi (no ``rope_parameters``)
ALIBI = frozenset({"bloom", "mpt"})
#: families whose attention sees no positions at all (Zamba: the Mamba layers carry order; no embedding table)
NO_POSITIONS = frozenset({"zamba"})


def positional(model_type: str, text: Any) -> str:
    if model_type in ALIBI or getattr(text, "alibi", False):
        return "alibi"
    if model_type in NO_POSITIONS:
        return "none"
    flag = ROPE_FLAG.get(model_type)
    if flag and not getattr(text, flag, False):
        return "none"  # RoPE switched off by the family's own flag
    if getattr(text, "rope_parameters", None):
        # some hybrids gate RoPE on ``position_embedding_type`` (GraniteMoeHybrid: None = NoPE)
        if hasattr(text, "position_embedding_type") and text.position_embedding_type not in ("rope", "rotary"):
            return "none"
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


#: families whose sliding layers cache a multiple of ``num_key_value_heads`` (MiMo-V2-Flash: twice)
SWA_KV_MULTIPLIER = {"mimo_v2_flash": 2}

#: per-layer attributes of sliding layers in families that size them apart (Inkling)
SWA_ATTRS = {"heads": "swa_num_attention_heads", "kv": "swa_num_key_value_heads", "head_dim": "swa_head_dim"}


def cached_kv_heads(model_type: str, layer_cfg: Any, heads: int, sliding: bool = False) -> int:
    """KV heads one layer stores in the cache."""
    from kvbridge.builtin.families.generic import _layer_attr

    if sliding and _layer_attr(layer_cfg, SWA_ATTRS["kv"], None):
        return int(_layer_attr(layer_cfg, SWA_ATTRS["kv"]))
    if sliding and model_type in SWA_KV_MULTIPLIER:
        base = _layer_attr(layer_cfg, "num_key_value_heads", None) or heads
        return int(base) * SWA_KV_MULTIPLIER[model_type]
    if _layer_attr(layer_cfg, "kv_lora_rank", None):  # MLA: one latent "head" per token
        return 1
    if _layer_attr(layer_cfg, "multi_query", False):
        return 1
    kv = _layer_attr(layer_cfg, "num_key_value_heads", None) or _layer_attr(layer_cfg, "num_kv_heads", None)
    return int(kv or heads)


def key_head_dim(model_type: str, layer_cfg: Any, heads: int, hidden: int, sliding: bool = False) -> int:
    from kvbridge.builtin.families.generic import _layer_attr

    if sliding and _layer_attr(layer_cfg, SWA_ATTRS["head_dim"], None):
        return int(_layer_attr(layer_cfg, SWA_ATTRS["head_dim"]))
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
