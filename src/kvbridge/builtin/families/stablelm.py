"""StableLM (``model_type`` ``stablelm``: StableLM-3B-4E1T, StableLM-2, Zephyr-3B).

Cache: ``num_key_value_heads`` (class default 32 when absent), head dim always
``hidden_size // num_attention_heads``. Partial RoPE, half-split within the first
``partial_rotary_factor`` of the head (default 0.25). Rotary module: ``model.model.rotary_emb``.
``qk_layernorm`` adds per-head LayerNorm on q/k before RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvbridge.builtin.families._common import DecoderAdapter, tiny_base


@dataclass(frozen=True)
class StableLmAdapter(DecoderAdapter):
    """Stability AI StableLM decoders."""

    name: str = "stablelm"
    model_types: tuple = ("stablelm",)
    description: str = "StableLM: partial half-split RoPE (default 0.25), optional q/k LayerNorm"

    DEFAULT_VOCAB: ClassVar[int] = 50304
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 4096
    DEFAULT_KV_HEADS: ClassVar[int | None] = 32
    HEAD_DIM_KEY: ClassVar[str | None] = None
    PARTIAL_ROTARY: ClassVar[bool] = True
    DEFAULT_PARTIAL: ClassVar[float | None] = 0.25
    QK_NORM: ClassVar[str | bool] = "qk_layernorm"

    def tiny_configs(self) -> dict[str, dict]:
        return {
            "default": tiny_base("stablelm", partial_rotary_factor=0.25),
            "qk_layernorm": tiny_base("stablelm", partial_rotary_factor=0.5, qk_layernorm=True, use_qkv_bias=True),
        }


ADAPTER = StableLmAdapter()
