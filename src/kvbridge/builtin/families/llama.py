"""Llama (``model_type`` ``llama``): the reference RoPE decoder.

Cache: ``num_key_value_heads`` heads (GQA; default = query heads), ``head_dim`` (explicit, else
``hidden_size // num_attention_heads``). RoPE: half-split (``rotate_half``), whole head, every
rope type of ``transformers.modeling_rope_utils`` (default, linear, dynamic, yarn, longrope,
llama3). Rotary module: ``model.model.rotary_emb``. No sliding window, no q/k norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvbridge.builtin.families._common import DecoderAdapter, tiny_base


@dataclass(frozen=True)
class LlamaAdapter(DecoderAdapter):
    """Llama and its rope-scaled variants (Llama 2, 3, 3.1, 3.2 ...)."""

    name: str = "llama"
    model_types: tuple = ("llama",)
    description: str = "Llama: GQA, half-split RoPE with every HF rope type"

    DEFAULT_VOCAB: ClassVar[int] = 32000
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 2048

    def tiny_configs(self) -> dict[str, dict]:
        head_dim = 16  # 64 / 4 heads: longrope needs head_dim / 2 = 8 factors
        return {
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
            "dynamic": tiny_base(
                "llama", max_position_embeddings=12, rope_scaling={"rope_type": "dynamic", "factor": 2.0}
            ),
            # original 8 < 16-token tests: long factors are used past position 8
            "longrope": tiny_base(
                "llama",
                max_position_embeddings=32,
                rope_scaling={
                    "rope_type": "longrope",
                    "factor": 4.0,
                    "original_max_position_embeddings": 8,
                    "short_factor": [1.0 + 0.05 * i for i in range(head_dim // 2)],
                    "long_factor": [1.5 + 0.25 * i for i in range(head_dim // 2)],
                },
            ),
        }


ADAPTER = LlamaAdapter()
