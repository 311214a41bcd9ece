"""Gemma 1 (``model_type`` ``gemma``).

Cache: ``num_key_value_heads`` (default 16), ``head_dim`` (class default 256, independent of
``hidden_size``). RoPE: half-split, whole head, ``model.model.rotary_emb``. No sliding window,
no q/k norm (Gemma's embedding scaling and ``1 + weight`` RMSNorm do not touch the cache layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvbridge.builtin.families._common import DecoderAdapter, tiny_base


@dataclass(frozen=True)
class GemmaAdapter(DecoderAdapter):
    """Gemma 2B / 7B (first generation)."""

    name: str = "gemma"
    model_types: tuple = ("gemma",)
    description: str = "Gemma: half-split RoPE, explicit head_dim (default 256)"

    DEFAULT_VOCAB: ClassVar[int] = 256000
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 8192
    DEFAULT_KV_HEADS: ClassVar[int | None] = 16
    DEFAULT_HEAD_DIM: ClassVar[int | None] = 256

    def tiny_configs(self) -> dict[str, dict]:
        return {"default": tiny_base("gemma", head_dim=16, num_key_value_heads=1, hidden_act="gelu_pytorch_tanh")}


ADAPTER = GemmaAdapter()
