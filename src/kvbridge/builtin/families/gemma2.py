"""Gemma 2 (``model_type`` ``gemma2``).

Cache: ``num_key_value_heads`` (default 4), ``head_dim`` (default 256). RoPE: half-split, whole
head, one table for all layers (``model.model.rotary_emb``). Layers alternate sliding / full
starting with sliding (``layer_types`` default: layer ``i`` slides when ``(i + 1) % 2``), window
``sliding_window`` (default 4096). No q/k norm (attention logits are soft-capped instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from kvbridge.builtin.families._common import (
    DecoderAdapter,
    layer_types_from,
    optional_positive_int,
    tiny_base,
)
from kvbridge.spec import FULL, SLIDING


@dataclass(frozen=True)
class Gemma2Adapter(DecoderAdapter):
    """Gemma 2 (2B, 9B, 27B): hybrid local/global attention."""

    name: str = "gemma2"
    model_types: tuple = ("gemma2",)
    description: str = "Gemma 2: half-split RoPE, alternating sliding/full layers"

    DEFAULT_VOCAB: ClassVar[int] = 256000
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 8192
    DEFAULT_KV_HEADS: ClassVar[int | None] = 4
    DEFAULT_HEAD_DIM: ClassVar[int | None] = 256
    DEFAULT_WINDOW: ClassVar[int | None] = 4096

    def _layout(self, cfg: Mapping, num_layers: int):
        window = optional_positive_int(cfg, "sliding_window", self.DEFAULT_WINDOW)
        default = [SLIDING if (i + 1) % 2 else FULL for i in range(num_layers)]
        return window, layer_types_from(cfg, num_layers, default)

    def tiny_configs(self) -> dict[str, dict]:
        return {
            "default": tiny_base(
                "gemma2",
                num_hidden_layers=4,
                head_dim=16,
                sliding_window=4,
                query_pre_attn_scalar=16,
                hidden_activation="gelu_pytorch_tanh",
            )
        }


ADAPTER = Gemma2Adapter()
