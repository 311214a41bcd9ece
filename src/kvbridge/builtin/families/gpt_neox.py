"""GPT-NeoX / Pythia (``model_type`` ``gpt_neox``).

Cache: all ``num_attention_heads`` (no GQA), head dim ``hidden_size // num_attention_heads``.
Partial RoPE, half-split within the first ``rotary_pct`` of the head (default 0.25), base
``rotary_emb_base`` (default 10000). transformers reads those legacy names, or
``rope_parameters`` / ``rope_scaling``; a top-level ``rope_theta`` or ``partial_rotary_factor``
is *ignored* by ``GPTNeoXConfig`` in 5.24, so it is ignored here too. Rotary module:
``model.gpt_neox.rotary_emb``. (The fused QKV projection is interleaved per head, which does
not affect the cache layout.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from kvbridge.builtin.families._common import DecoderAdapter, flat_rope_parameters

TINY = {
    "model_type": "gpt_neox",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "dtype": "float32",
}


@dataclass(frozen=True)
class GPTNeoXAdapter(DecoderAdapter):
    """EleutherAI GPT-NeoX and Pythia."""

    name: str = "gpt_neox"
    model_types: tuple = ("gpt_neox",)
    description: str = "GPT-NeoX/Pythia: MHA, partial half-split RoPE (rotary_pct, default 0.25)"

    DEFAULT_VOCAB: ClassVar[int] = 50432
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 2048
    HEAD_DIM_KEY: ClassVar[str | None] = None
    MHA: ClassVar[bool] = True
    PARTIAL_ROTARY: ClassVar[bool] = True
    DEFAULT_PARTIAL: ClassVar[float | None] = 0.25

    def _rope_parameters(self, cfg: Mapping, max_positions: int) -> dict:
        return flat_rope_parameters(
            cfg,
            default_theta=self.DEFAULT_THETA,
            theta_keys=("rotary_emb_base",),
            partial_keys=("rotary_pct",),
            default_partial=self.DEFAULT_PARTIAL,
            max_positions=max_positions,
        )

    def tiny_configs(self) -> dict[str, dict]:
        return {
            "legacy": {**TINY, "rotary_pct": 0.25, "rotary_emb_base": 10000},
            "rope_parameters": {
                **TINY,
                "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5},
            },
        }


ADAPTER = GPTNeoXAdapter()
