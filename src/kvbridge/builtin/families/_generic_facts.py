"""Facts about transformers families that their config class does not state.

Each entry is a property of the family's modeling code (how it rotates keys, which layers skip
RoPE, how many heads it caches); ``kvbridge conformance`` checks every one against the cache the
model really produces, so a wrong entry shows up as a wrong fact in the sweep. Pure python.
"""

from __future__ import annotations

from typing import Any

from kvbridge.builtin.families._common import layer_attr as _layer_attr
from kvbridge.spec import CHUNKED, FULL, SLIDING

#: the fix line of a refusal
REFUSED_FIX = "kvbridge moves caches it can represent exactly; see docs/supported-models.md"

#: model types refused before reading the config, with the reason (what differs in the cache)
REFUSED: dict[str, str] = {
    **dict.fromkeys(
        ("mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm"), "no attention KV cache (recurrent/state-space model)"
    ),
    "recurrent_gemma": "its recurrent blocks keep their state on the model's own modules (conv1d_state,"
    " rg_lru.recurrent_states), not in the cache: a cache alone cannot carry it",
    "openai-gpt": "the model keeps no KV cache (generation recomputes the whole prefix)",
    "mllama": "its cross-attention layers cache image K/V that the text tokens do not produce",
    "moshi": "text and audio streams share its cache; a continuation also needs the audio codebooks",
    "xlm": "its generate appends a mask token to the whole prefix at every step, and transformers' own"
    " continuation of a prefilled cache fails: there is no cached continuation to match",
    "whisper": "its decoder also caches cross-attention K/V of the audio encoder (an encoder-decoder cache)",
    "xlnet": "it carries `mems` (each layer's input hidden states, turned into K/V again every step), not a K/V cache",
    "reformer": "its own ReformerDynamicCache keeps hidden states and LSH buckets, not K/V",
    **dict.fromkeys(
        ("gemma4_assistant", "gemma4_unified_assistant"),
        "an assistant (draft) model: every layer reuses the K/V its target model computed (shared_kv_states);"
        " it caches none of its own",
    ),
    "blt": "byte-level model: local byte encoder/decoder stacks, a global patch transformer and cross-attention"
    " between bytes and patches share one encoder-decoder cache, not per-token K/V of one decoder stack",
    "cpmant": "its cache holds `prompt_length` learned prompt positions ahead of the tokens (cached length != tokens)",
}

#: families whose model builds its own cache class (generate passes none), and the attribute that
#: holds per-layer recurrent state outside the layers: MiniMax keeps each lightning-attention
#: layer's K^T V state in ``MiniMaxCache.linear_cache[layer]``
OWN_CACHE = {"minimax": ("MiniMaxCache", "linear_cache")}

#: transformers cache layer kinds kvbridge refuses, with what differs in them
LAYER_REFUSALS = {
    "heavily_compressed_attention": "its cache holds compressed blocks of tokens, not per-token K/V",
    "compressed_sparse_attention": "its cache holds compressed blocks of tokens, not per-token K/V",
}

#: families that rotate interleaved pairs (2i, 2i+1) instead of half-split
INTERLEAVED = frozenset(
    {
        "glm",
        "glm4",
        "cohere2",
        "cohere2_moe",
        "gptj",
        "codegen",
        "cohere",
        "ernie4_5",
        "ernie4_5_moe",
        "helium",
        "llama4",
        "llama4_text",
    }
)

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


#: families whose rotate_half is sign-flipped: keys rotate by -angle (RopeSpec scaling ``direction`` = -1)
NEGATIVE_ROTATION = frozenset({"nanochat"})

#: families whose attention applies RoPE only when a config flag is set (Zamba2: ``use_mem_rope``)
ROPE_FLAG = {"zamba2": "use_mem_rope"}

#: families with ALiBi (no ``rope_parameters``); without RoPE, ALiBi or a "no positions" fact a
#: family is ``absolute``: learned position embeddings, or positions that reach the keys through
#: the layers below (Inkling/Inkling2: a relative bias at attention time, but queries scaled by
#: their absolute position, so later layers' keys depend on it): never re-positioned
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
        return "rope" if getattr(text, "position_embedding_type", "rope") in ("rope", "rotary") else "none"
    return "absolute" if getattr(text, "position_embedding_type", "absolute") in ("absolute", None) else "none"


#: MLA families that rotate the cached RoPE key with a complex multiply (interleaved pairs)
MLA_COMPLEX = frozenset({"deepseek_v2"})


def interleaved(model_type: str, text: Any) -> bool:
    if getattr(text, "kv_lora_rank", None):
        # MLA: only V2's complex rotation caches interleaved pairs. DeepSeek-V3 style
        # ``rope_interleave`` reads the pairs (2i, 2i+1) of its input but writes the rotated key
        # de-interleaved (``cat([x1 cos - x2 sin, x2 cos + x1 sin])``): the cached key is half-split
        return model_type in MLA_COMPLEX
    return model_type in INTERLEAVED


#: sparse-attention (DSA) families whose indexer rotates the last ``qk_rope_head_dim`` dims of its
#: keys (the others rotate the first ones); every DSA indexer caches its rotated part half-split
INDEXER_ROPE_LAST = frozenset({"hy_v4"})
#: Qwen4-Exp's QSA indexer caches un-rotated keys (``indexer_head_dim``), pooled into blocks and
#: rotated at run time from a 3-row (M-RoPE) position history kept on the first indexed layer; for
#: text that history is the token positions on every row, so it is rebuilt from the state's positions
INDEXER_RAW_KEYS = frozenset({"qwen4_exp", "qwen4_exp_text"})


def indexer(model_type: str, text: Any, indexed: list) -> dict:
    """Indexer-key cache of a DSA model: the layers that run their own indexer (``indexer_types``
    "full"; "shared" layers reuse an earlier layer's top-k and cache none), the keys' head dim
    and where their RoPE part sits. Raises ``ValueError`` with the reason for other kinds."""
    if model_type in INDEXER_RAW_KEYS:
        head_dim = _layer_attr(text, "indexer_head_dim", None)
        if not head_dim or int(_layer_attr(text, "indexer_kv_heads", 1)) != 1:
            raise ValueError(
                "its QSA indexer is not configured with one key head (`indexer_head_dim`, `indexer_kv_heads`)"
            )
        return {
            "layers": tuple(indexed),
            "head_dim": int(head_dim),
            "rope_dim": 0,
            "rope_offset": 0,
            "position_rows": 3,
        }
    head_dim = _layer_attr(text, "index_head_dim", None)
    if not head_dim:
        raise ValueError("its sparse-attention indexer cache has no known layout (no `index_head_dim`)")
    modes = list(getattr(text, "indexer_types", None) or [])
    layers = tuple(i for i in indexed if not (i < len(modes) and modes[i] == "shared"))
    rope_dim = int(_layer_attr(text, "qk_rope_head_dim", 0) or 0)
    offset = int(head_dim) - rope_dim if model_type in INDEXER_ROPE_LAST else 0
    return {"layers": layers, "head_dim": int(head_dim), "rope_dim": rope_dim, "rope_offset": offset}


def nope_layers(model_type: str, text: Any, kinds: list) -> tuple:
    """Layers whose keys carry no RoPE."""
    flags = getattr(text, "no_rope_layers", None)
    if flags:  # SmolLM3 / Llama 4: 1 = the layer uses RoPE, 0 = NoPE
        return tuple(
            i for i, f in enumerate(flags) if not f and i < len(kinds) and kinds[i] in (FULL, SLIDING, CHUNKED)
        )
    if model_type in NOPE_ON_FULL or (model_type in NOPE_ON_FULL_IF_SLIDING and SLIDING in kinds):
        return tuple(i for i, k in enumerate(kinds) if k == FULL)
    return ()


#: families whose sliding layers cache a multiple of ``num_key_value_heads`` (MiMo-V2-Flash: twice)
SWA_KV_MULTIPLIER = {"mimo_v2_flash": 2}

#: per-layer attributes of sliding layers in families that size them apart (Inkling)
SWA_ATTRS = {"heads": "swa_num_attention_heads", "kv": "swa_num_key_value_heads", "head_dim": "swa_head_dim"}


def cached_kv_heads(model_type: str, layer_cfg: Any, heads: int, sliding: bool = False) -> int:
    """KV heads one layer stores in the cache."""
    if sliding and _layer_attr(layer_cfg, SWA_ATTRS["kv"], None):
        return int(_layer_attr(layer_cfg, SWA_ATTRS["kv"]))
    if sliding and model_type in SWA_KV_MULTIPLIER:
        return int(_layer_attr(layer_cfg, "num_key_value_heads", None) or heads) * SWA_KV_MULTIPLIER[model_type]
    if _layer_attr(layer_cfg, "kv_lora_rank", None) or _layer_attr(layer_cfg, "multi_query", False):
        return 1  # MLA: one latent "head" per token; multi-query: one KV head
    kv = _layer_attr(layer_cfg, "num_key_value_heads", None) or _layer_attr(layer_cfg, "num_kv_heads", None)
    return int(kv or heads)


def key_head_dim(layer_cfg: Any, heads: int, hidden: int, sliding: bool = False) -> int:
    if sliding and _layer_attr(layer_cfg, SWA_ATTRS["head_dim"], None):
        return int(_layer_attr(layer_cfg, SWA_ATTRS["head_dim"]))
    if _layer_attr(layer_cfg, "kv_lora_rank", None):  # MLA: the "keys" slot holds the compressed latent
        return int(_layer_attr(layer_cfg, "kv_lora_rank"))
    hd = _layer_attr(layer_cfg, "head_dim", None) or _layer_attr(layer_cfg, "dim_head", None)
    return int(hd) if hd else int(_layer_attr(layer_cfg, "hidden_size", hidden)) // heads


def mla_sizes(text: Any) -> dict:
    """MLA latent sizes, {} for other attention."""
    if not _layer_attr(text, "kv_lora_rank", None):
        return {}
    return {
        k: int(_layer_attr(text, k, 0) or 0)
        for k in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    }
