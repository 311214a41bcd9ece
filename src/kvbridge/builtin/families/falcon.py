"""Falcon (``model_type`` ``falcon``).

KV heads *as stored in the cache* (``FalconAttention.forward``):

- ``new_decoder_architecture`` (Falcon-40B/180B, Falcon2): all ``num_attention_heads`` -- the
  ``num_kv_heads`` groups are broadcast to every query head before caching;
- else ``multi_query`` (class default true; Falcon-7B): 1;
- else ``num_kv_heads`` (default = query heads; Falcon-RW).

Head dim ``hidden_size // num_attention_heads`` (legacy ``n_embed`` wins over ``hidden_size``).
Positions: ALiBi when ``alibi`` (no RoPE; the model still builds an unused rotary module, and
:meth:`rotary_embedding` returns None), else half-split RoPE over the whole head with every HF
rope type; rotary module ``model.transformer.rotary_emb``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Mapping

from kvbridge.builtin.families._common import DecoderAdapter, as_mapping, flag, optional_positive_int


@dataclass(frozen=True)
class FalconAdapter(DecoderAdapter):
    """TII Falcon (7B multi-query, 40B/180B new architecture, RW ALiBi models)."""

    name: str = "falcon"
    model_types: tuple = ("falcon",)
    description: str = "Falcon: multi-query / grouped (cached per query head) / ALiBi variants"

    HIDDEN_KEYS: ClassVar[tuple] = ("n_embed", "hidden_size")
    DEFAULT_VOCAB: ClassVar[int] = 65024
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 2048
    HEAD_DIM_KEY: ClassVar[str | None] = None

    def _cache_kv_heads(self, cfg: Mapping, heads: int) -> int:
        if flag(cfg, "new_decoder_architecture", False):
            return heads
        if flag(cfg, "multi_query", True):
            return 1
        return optional_positive_int(cfg, "num_kv_heads") or heads

    def _positional(self, cfg: Mapping) -> str:
        return "alibi" if flag(cfg, "alibi", False) else "rope"

    def describe(self, config: Mapping):
        spec = super().describe(config)
        cfg = as_mapping(config)
        if flag(cfg, "new_decoder_architecture", False):
            # KV groups the projection computes (new arch broadcasts them per query head before caching)
            groups = optional_positive_int(cfg, "num_kv_heads") or spec.num_attention_heads
            if groups < spec.num_kv_heads:
                spec = replace(spec, kv_groups=groups)
        return spec

    def _extras(self, cfg: Mapping) -> dict:
        kv_groups = cfg.get("num_kv_heads")
        return {
            "alibi": flag(cfg, "alibi", False),
            "multi_query": flag(cfg, "multi_query", True),
            "new_decoder_architecture": flag(cfg, "new_decoder_architecture", False),
            "parallel_attn": flag(cfg, "parallel_attn", True),
            "num_kv_heads": cfg.get("num_attention_heads") if kv_groups is None else kv_groups,
        }

    def tiny_configs(self) -> dict[str, dict]:
        common = {
            "model_type": "falcon",
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "vocab_size": 128,
            "max_position_embeddings": 64,
            "ffn_hidden_size": 128,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
            "dtype": "float32",
        }
        rope = {**common, "parallel_attn": True, "bias": False, "rope_theta": 10000.0}
        return {
            "new_arch": {**rope, "new_decoder_architecture": True, "num_kv_heads": 2, "multi_query": False},
            "multi_query": {**rope, "new_decoder_architecture": False, "multi_query": True},
            "alibi": {
                **common,
                "alibi": True,
                "multi_query": False,
                "new_decoder_architecture": False,
                "parallel_attn": False,
                "bias": True,
            },
        }


ADAPTER = FalconAdapter()
