"""The built-in families that differ from :class:`~kvbridge.builtin.families._common.DecoderAdapter`
only in constants (and Qwen's sliding layout, one function): one row each (its ``model_type``, a
one-line description, transformers' class defaults and the tiny test configs). A family whose model
reads its config in a way of its own keeps a file (``phi3.py``, ``falcon.py``, ``gemma3_text.py`` ...).

- ``llama``: the reference RoPE decoder (Llama 2, 3, 3.1, 3.2 ...). Cache: ``num_key_value_heads``
  heads (GQA; default = query heads), ``head_dim`` (explicit, else ``hidden_size //
  num_attention_heads``). RoPE: half-split (``rotate_half``), whole head, every rope type of
  ``transformers.modeling_rope_utils`` (default, linear, dynamic, yarn, longrope, llama3). Rotary
  module: ``model.model.rotary_emb``. No sliding window, no q/k norm.
- ``mistral``: like Llama, plus one ``sliding_window`` that transformers applies to *every* layer
  when it is set (the class default is 4096 when the key is absent; ``null`` means full
  attention). A ``layer_types`` key is ignored by ``MistralModel`` (transformers only warns), so it
  is ignored here too.
- ``qwen2`` (Qwen2 / Qwen2.5): ``num_key_value_heads`` (GQA; class default 32 when absent), head
  dim ``head_dim`` if the config has one, else ``hidden_size // num_attention_heads``. RoPE:
  half-split, whole head. Sliding window, as ``Qwen2Config`` decides it: ``sliding_window`` counts
  only when ``use_sliding_window`` is true, and then only layers ``i >= max_window_layers`` slide
  (an explicit ``layer_types`` wins). Published Qwen2/2.5 checkpoints ship
  ``use_sliding_window: false``: all layers full.
- ``qwen3``: Qwen2's layout (GQA, half-split RoPE, sliding only with ``use_sliding_window`` above
  ``max_window_layers``) plus per-head RMSNorm of q and k *before* RoPE (``qk_norm``). ``head_dim``
  defaults to 128 when absent (``Qwen3Config`` default), not to ``hidden_size //
  num_attention_heads``.
- ``gemma`` (Gemma 1: 2B, 7B): ``num_key_value_heads`` (default 16), ``head_dim`` (class default
  256, independent of ``hidden_size``). RoPE: half-split, whole head. No sliding window, no q/k
  norm (Gemma's embedding scaling and ``1 + weight`` RMSNorm do not touch the cache layout).
- ``gemma2`` (Gemma 2: 2B, 9B, 27B; hybrid local/global attention): ``num_key_value_heads``
  (default 4), ``head_dim`` (default 256). RoPE: half-split, whole head, one table for all layers.
  Layers alternate sliding / full starting with sliding (``layer_types`` default: layer ``i``
  slides when ``(i + 1) % 2``), window ``sliding_window`` (default 4096). No q/k norm (attention
  logits are soft-capped instead).
- ``phi`` (Phi-1, 1.5, 2): partial RoPE: only the first ``int(head_dim * partial_rotary_factor)``
  dims rotate, half-split within them (default factor 0.5 when the config has none; Phi-2 ships
  0.4). ``qk_layernorm`` adds LayerNorm on q/k before RoPE.
- ``stablelm`` (StableLM-3B-4E1T, StableLM-2, Zephyr-3B): ``num_key_value_heads`` (class default
  32 when absent), head dim always ``hidden_size // num_attention_heads``. Partial RoPE,
  half-split within the first ``partial_rotary_factor`` of the head (default 0.25).
  ``qk_layernorm`` adds per-head LayerNorm on q/k before RoPE.
- ``cohere`` (Command-R / Command-R+, first generation): RoPE on *interleaved* pairs ``(2i, 2i+1)``
  (Cohere's own ``rotate_half`` and ``repeat_interleave`` of the frequencies), whole head, default
  base 500000, computed in float32 and cast back to the model dtype. ``use_qk_norm`` adds per-head
  LayerNorm on q/k before RoPE.
- ``gpt2`` (GPT-2, DistilGPT-2): config names ``n_layer``, ``n_head``, ``n_embd``, ``n_positions``
  (aliases ``num_hidden_layers`` ... are read too). Cache: all heads, head dim ``n_embd // n_head``.
  Positions: learned absolute embeddings (``wpe``) added to the input: cached keys carry no
  rotation, so ``positional`` is ``"absolute"``, ``rope`` is None and the model has no rotary module.
- ``gpt_neox`` (GPT-NeoX / Pythia): all ``num_attention_heads`` cached (no GQA), head dim
  ``hidden_size // num_attention_heads``. Partial RoPE, half-split within the first ``rotary_pct``
  of the head (default 0.25), base ``rotary_emb_base`` (default 10000); transformers reads those
  legacy names, or ``rope_parameters`` / ``rope_scaling``; a top-level ``rope_theta`` or
  ``partial_rotary_factor`` is *ignored* by ``GPTNeoXConfig`` in 5.24, so it is ignored here too.
  Rotary module: ``model.gpt_neox.rotary_emb``. (The fused QKV projection is interleaved per head,
  which does not affect the cache layout.)
- ``gptj`` (GPT-J): GPT-2's config names; all heads cached, head dim ``n_embd // n_head``. RoPE:
  *interleaved* pairs ``(2i, 2i+1)`` (``rotate_every_two``) over the first ``rotary_dim`` dims
  (default 64; ``null`` = the whole head), fixed base 10000 (GPT-J has no rope parameters). Rotary
  module: ``model.transformer.rotary_emb``, which is unlike the others: it holds a precomputed
  ``embed_positions`` table of ``n_positions`` rows and returns ``(sin, cos)`` at half width
  (``rotary_dim // 2``), repeat-interleaved inside attention.
- ``olmo2`` (AllenAI OLMo 2): half-split RoPE, whole head; q/k RMSNorm before RoPE over the *whole*
  projection (``num_heads * head_dim`` wide, not per head): ``extras["qk_norm_scope"] ==
  "projection"``.

Unless a row says otherwise: KV heads ``num_key_value_heads`` (default = query heads), ``head_dim``
explicit else ``hidden_size // num_attention_heads``, rotary module ``model.model.rotary_emb``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Mapping

from kvbridge.builtin.families._common import (
    DecoderAdapter,
    flag,
    get,
    layer_types_from,
    optional_positive_int,
    tiny_base,
)
from kvbridge.errors import ConfigError
from kvbridge.spec import FULL, SLIDING


def family(cls_name: str, model_type: str, description: str, tiny: dict, base=DecoderAdapter, **defaults) -> type:
    """A frozen ``base`` subclass ``cls_name`` for ``model_type`` whose class defaults are ``defaults``
    (``DEFAULT_VOCAB=...``, the knobs of :class:`DecoderAdapter`) and whose ``tiny_configs()`` are
    copies of ``tiny``."""
    namespace = {
        "__module__": __name__,
        "__qualname__": cls_name,
        "__annotations__": {"name": str, "model_types": tuple, "description": str},
        "name": model_type,
        "model_types": (model_type,),
        "description": description,
        "tiny_configs": lambda self: copy.deepcopy(tiny),
        **defaults,
    }
    return dataclass(frozen=True)(type(cls_name, (base,), namespace))


_LONGROPE_HALF = 8  # llama tiny head_dim 64 / 4 heads = 16: longrope needs head_dim / 2 factors
LlamaAdapter = family(
    "LlamaAdapter",
    "llama",
    "Llama: GQA, half-split RoPE with every HF rope type",
    {
        "default": tiny_base("llama"),
        "llama3": tiny_base(
            "llama",
            max_position_embeddings=128,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        "yarn": tiny_base(
            "llama",
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            },
        ),
        "linear": tiny_base("llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
        # max_position_embeddings 12 < 16-token tests: the dynamic table really changes
        "dynamic": tiny_base("llama", max_position_embeddings=12, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
        # original 8 < 16-token tests: long factors are used past position 8
        "longrope": tiny_base(
            "llama",
            max_position_embeddings=32,
            rope_scaling={
                "rope_type": "longrope",
                "factor": 4.0,
                "original_max_position_embeddings": 8,
                "short_factor": [1.0 + 0.05 * i for i in range(_LONGROPE_HALF)],
                "long_factor": [1.5 + 0.25 * i for i in range(_LONGROPE_HALF)],
            },
        ),
    },
    DEFAULT_VOCAB=32000,
    DEFAULT_MAX_POSITIONS=2048,
)
MistralAdapter = family(
    "MistralAdapter",
    "mistral",
    "Mistral: GQA, half-split RoPE, sliding window on every layer",
    {"sliding": tiny_base("mistral", sliding_window=6), "full": tiny_base("mistral", sliding_window=None)},
    DEFAULT_VOCAB=32000,
    DEFAULT_MAX_POSITIONS=4096 * 32,
    DEFAULT_KV_HEADS=8,
    DEFAULT_WINDOW=4096,
    ALL_SLIDING=True,
)


def qwen_layout(cfg: Mapping, num_layers: int) -> tuple:
    """(window, layer types) the way Qwen2Config / Qwen3Config compute them, with their class defaults."""
    window = optional_positive_int(cfg, "sliding_window", 4096)
    if not flag(cfg, "use_sliding_window", False):
        window = None
    max_window_layers = get(cfg, "max_window_layers", 28)
    if isinstance(max_window_layers, bool) or not isinstance(max_window_layers, int) or max_window_layers < 0:
        raise ConfigError(
            f"config field 'max_window_layers' must be an integer >= 0, got {max_window_layers!r}",
            "set 'max_window_layers' to the number of leading full-attention layers",
        )
    default = [SLIDING if window is not None and i >= max_window_layers else FULL for i in range(num_layers)]
    return window, layer_types_from(cfg, num_layers, default)


Qwen2Adapter = family(
    "Qwen2Adapter",
    "qwen2",
    "Qwen2/2.5: GQA, half-split RoPE, optional sliding window above max_window_layers",
    {
        "default": tiny_base("qwen2", sliding_window=32768, use_sliding_window=False, max_window_layers=2),
        # layer 0 full, layers 1-2 slide over 4 tokens
        "sliding": tiny_base(
            "qwen2", num_hidden_layers=3, use_sliding_window=True, sliding_window=4, max_window_layers=1
        ),
    },
    DEFAULT_VOCAB=151936,
    DEFAULT_MAX_POSITIONS=32768,
    DEFAULT_KV_HEADS=32,
    _layout=lambda self, cfg, num_layers: qwen_layout(cfg, num_layers),
    _extras=lambda self, cfg: {"use_sliding_window": flag(cfg, "use_sliding_window", False)},
)
Qwen3Adapter = family(
    "Qwen3Adapter",
    "qwen3",
    "Qwen3: GQA, q/k RMSNorm before half-split RoPE, head_dim default 128",
    {  # head_dim 32 != hidden 64 / 4 heads: exercises the explicit head_dim
        "default": tiny_base(
            "qwen3",
            head_dim=32,
            rope_theta=1000000.0,
            sliding_window=None,
            use_sliding_window=False,
            max_window_layers=2,
        ),
        "sliding": tiny_base(
            "qwen3", num_hidden_layers=3, head_dim=16, use_sliding_window=True, sliding_window=4, max_window_layers=1
        ),
    },
    base=Qwen2Adapter,  # vocab, positions, KV-head defaults, sliding layout and extras: as Qwen2
    DEFAULT_HEAD_DIM=128,
    QK_NORM=True,
)
GemmaAdapter = family(
    "GemmaAdapter",
    "gemma",
    "Gemma: half-split RoPE, explicit head_dim (default 256)",
    {"default": tiny_base("gemma", head_dim=16, num_key_value_heads=1, hidden_act="gelu_pytorch_tanh")},
    DEFAULT_VOCAB=256000,
    DEFAULT_MAX_POSITIONS=8192,
    DEFAULT_KV_HEADS=16,
    DEFAULT_HEAD_DIM=256,
)
Gemma2Adapter = family(
    "Gemma2Adapter",
    "gemma2",
    "Gemma 2: half-split RoPE, alternating sliding/full layers",
    {
        "default": tiny_base(
            "gemma2",
            num_hidden_layers=4,
            head_dim=16,
            sliding_window=4,
            query_pre_attn_scalar=16,
            hidden_activation="gelu_pytorch_tanh",
        )
    },
    DEFAULT_VOCAB=256000,
    DEFAULT_MAX_POSITIONS=8192,
    DEFAULT_KV_HEADS=4,
    DEFAULT_HEAD_DIM=256,
    DEFAULT_WINDOW=4096,
    SLIDING_PATTERN=2,
)
_PHI = dict(hidden_act="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0)
PhiAdapter = family(
    "PhiAdapter",
    "phi",
    "Phi 1/1.5/2: partial half-split RoPE (default 0.5), optional q/k LayerNorm",
    {  # head_dim 16, factor 0.5 -> 8 rotary dims
        "default": tiny_base("phi", partial_rotary_factor=0.5, num_key_value_heads=4, **_PHI),
        "qk_layernorm": tiny_base("phi", partial_rotary_factor=0.5, qk_layernorm=True, **_PHI),
    },
    DEFAULT_VOCAB=51200,
    DEFAULT_MAX_POSITIONS=2048,
    PARTIAL_ROTARY=True,
    DEFAULT_PARTIAL=0.5,
    QK_NORM="qk_layernorm",
)
StableLmAdapter = family(
    "StableLmAdapter",
    "stablelm",
    "StableLM: partial half-split RoPE (default 0.25), optional q/k LayerNorm",
    {
        "default": tiny_base("stablelm", partial_rotary_factor=0.25),
        "qk_layernorm": tiny_base("stablelm", partial_rotary_factor=0.5, qk_layernorm=True, use_qkv_bias=True),
    },
    DEFAULT_VOCAB=50304,
    DEFAULT_MAX_POSITIONS=4096,
    DEFAULT_KV_HEADS=32,
    HEAD_DIM_KEY=None,
    PARTIAL_ROTARY=True,
    DEFAULT_PARTIAL=0.25,
    QK_NORM="qk_layernorm",
)
_COHERE_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
CohereAdapter = family(
    "CohereAdapter",
    "cohere",
    "Cohere: GQA, interleaved RoPE (base 500000), optional q/k LayerNorm",
    {
        "default": tiny_base("cohere", rope_theta=500000.0, **_COHERE_IDS),
        "qk_norm": tiny_base("cohere", use_qk_norm=True, **_COHERE_IDS),
    },
    DEFAULT_VOCAB=256000,
    DEFAULT_MAX_POSITIONS=8192,
    DEFAULT_THETA=500000.0,
    INTERLEAVED=True,
    QK_NORM="use_qk_norm",
    EXTRAS={"rope_compute_dtype": "float32"},
)
Olmo2Adapter = family(
    "Olmo2Adapter",
    "olmo2",
    "OLMo 2: half-split RoPE, q/k RMSNorm over the whole projection",
    {"default": tiny_base("olmo2", pad_token_id=0, eos_token_id=1)},
    DEFAULT_VOCAB=50304,
    DEFAULT_MAX_POSITIONS=2048,
    QK_NORM=True,
    EXTRAS={"qk_norm_scope": "projection"},
)
_NEOX = {k: v for k, v in tiny_base("gpt_neox").items() if k not in ("num_key_value_heads", "rope_theta")}
GPTNeoXAdapter = family(
    "GPTNeoXAdapter",
    "gpt_neox",
    "GPT-NeoX/Pythia: MHA, partial half-split RoPE (rotary_pct, default 0.25)",
    {
        "legacy": {**_NEOX, "rotary_pct": 0.25, "rotary_emb_base": 10000},
        "rope_parameters": {
            **_NEOX,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5},
        },
    },
    DEFAULT_VOCAB=50432,
    DEFAULT_MAX_POSITIONS=2048,
    HEAD_DIM_KEY=None,
    MHA=True,
    PARTIAL_ROTARY=True,
    DEFAULT_PARTIAL=0.25,
    THETA_KEYS=("rotary_emb_base",),
    PARTIAL_KEYS=("rotary_pct",),
)
_GPT2_TINY = {
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "n_positions": 64,
    "vocab_size": 128,
    "n_inner": 128,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "dtype": "float32",
}
_GPT2_NAMES = dict(  # GPT-2's config names, and transformers' aliases
    LAYERS_KEYS=("n_layer", "num_hidden_layers"),
    HEADS_KEYS=("n_head", "num_attention_heads"),
    HIDDEN_KEYS=("n_embd", "hidden_size"),
    MAX_POSITIONS_KEYS=("n_positions", "max_position_embeddings"),
    HEAD_DIM_KEY=None,
    MHA=True,
)
GPTJAdapter = family(
    "GPTJAdapter",
    "gptj",
    "GPT-J: MHA, interleaved partial RoPE over rotary_dim, base 10000",
    {"default": {"model_type": "gptj", **_GPT2_TINY, "rotary_dim": 8}},
    **_GPT2_NAMES,
    DEFAULT_VOCAB=50400,
    DEFAULT_MAX_POSITIONS=2048,
    INTERLEAVED=True,
    ROTARY_DIM=("rotary_dim", 64),
)
GPT2Adapter = family(
    "GPT2Adapter",
    "gpt2",
    "GPT-2: MHA, learned absolute position embeddings (no RoPE)",
    {"default": {"model_type": "gpt2", **_GPT2_TINY}},
    **_GPT2_NAMES,
    DEFAULT_VOCAB=50257,
    DEFAULT_MAX_POSITIONS=1024,
    POSITIONAL="absolute",
)

#: one adapter per row, by family name
ADAPTERS = {
    cls.name: cls()
    for cls in (
        LlamaAdapter,
        MistralAdapter,
        Qwen2Adapter,
        Qwen3Adapter,
        GemmaAdapter,
        Gemma2Adapter,
        PhiAdapter,
        StableLmAdapter,
        CohereAdapter,
        Olmo2Adapter,
        GPTNeoXAdapter,
        GPTJAdapter,
        GPT2Adapter,
    )
}
