"""Phi-1 / Phi-1.5 / Phi-2 (``model_type`` ``phi``).

Cache: ``num_key_value_heads`` (default = query heads), ``head_dim`` explicit else
``hidden_size // num_attention_heads``. Partial RoPE: only the first
``int(head_dim * partial_rotary_factor)`` dims rotate, half-split within them (default factor
0.5 when the config has none; Phi-2 ships 0.4). Rotary module: ``model.model.rotary_emb``.
``qk_layernorm`` adds LayerNorm on q/k before RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvbridge.builtin.families._common import DecoderAdapter, tiny_base


@dataclass(frozen=True)
class PhiAdapter(DecoderAdapter):
    """Microsoft Phi (1, 1.5, 2)."""

    name: str = "phi"
    model_types: tuple = ("phi",)
    description: str = "Phi 1/1.5/2: partial half-split RoPE (default 0.5), optional q/k LayerNorm"

    DEFAULT_VOCAB: ClassVar[int] = 51200
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 2048
    PARTIAL_ROTARY: ClassVar[bool] = True
    DEFAULT_PARTIAL: ClassVar[float | None] = 0.5
    QK_NORM: ClassVar[str | bool] = "qk_layernorm"

    def tiny_configs(self) -> dict[str, dict]:
        # head_dim 16, factor 0.5 -> 8 rotary dims
        return {
            "default": tiny_base(
                "phi",
                partial_rotary_factor=0.5,
                num_key_value_heads=4,
                hidden_act="gelu_new",
                resid_pdrop=0.0,
                embd_pdrop=0.0,
            ),
            "qk_layernorm": tiny_base(
                "phi",
                partial_rotary_factor=0.5,
                qk_layernorm=True,
                hidden_act="gelu_new",
                resid_pdrop=0.0,
                embd_pdrop=0.0,
            ),
        }


ADAPTER = PhiAdapter()
