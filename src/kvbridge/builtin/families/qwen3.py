"""Qwen3 (``model_type`` ``qwen3``).

Qwen2's layout (GQA, half-split RoPE, ``model.model.rotary_emb``, sliding only with
``use_sliding_window`` above ``max_window_layers``) plus per-head RMSNorm of q and k *before*
RoPE (``qk_norm``). ``head_dim`` defaults to 128 when absent (``Qwen3Config`` default), not to
``hidden_size // num_attention_heads``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvbridge.builtin.families._common import tiny_base
from kvbridge.builtin.families.qwen2 import Qwen2Adapter


@dataclass(frozen=True)
class Qwen3Adapter(Qwen2Adapter):
    """Qwen3 dense models."""

    name: str = "qwen3"
    model_types: tuple = ("qwen3",)
    description: str = "Qwen3: GQA, q/k RMSNorm before half-split RoPE, head_dim default 128"

    # vocab, positions, KV-head defaults, sliding layout and extras: as Qwen2
    DEFAULT_HEAD_DIM: ClassVar[int | None] = 128
    QK_NORM: ClassVar[bool] = True

    def tiny_configs(self) -> dict[str, dict]:
        # head_dim 32 != hidden 64 / 4 heads: exercises the explicit head_dim
        return {
            "default": tiny_base(
                "qwen3",
                head_dim=32,
                rope_theta=1000000.0,
                sliding_window=None,
                use_sliding_window=False,
                max_window_layers=2,
            ),
            "sliding": tiny_base(
                "qwen3",
                num_hidden_layers=3,
                head_dim=16,
                use_sliding_window=True,
                sliding_window=4,
                max_window_layers=1,
            ),
        }


ADAPTER = Qwen3Adapter()
