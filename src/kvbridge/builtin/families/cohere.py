"""Cohere Command-R (``model_type`` ``cohere``).

Cache: ``num_key_value_heads`` (default = query heads), ``head_dim`` explicit else
``hidden_size // num_attention_heads``. RoPE: *interleaved* pairs ``(2i, 2i+1)`` (Cohere's own
``rotate_half`` and ``repeat_interleave`` of the frequencies), whole head, default base 500000,
computed in float32 and cast back to the model dtype. Rotary module: ``model.model.rotary_emb``.
``use_qk_norm`` adds per-head LayerNorm on q/k before RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from kvbridge.builtin.families._common import DecoderAdapter, tiny_base


@dataclass(frozen=True)
class CohereAdapter(DecoderAdapter):
    """Cohere Command-R / Command-R+ (first generation)."""

    name: str = "cohere"
    model_types: tuple = ("cohere",)
    description: str = "Cohere: GQA, interleaved RoPE (base 500000), optional q/k LayerNorm"

    DEFAULT_VOCAB: ClassVar[int] = 256000
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 8192
    DEFAULT_THETA: ClassVar[float] = 500000.0
    INTERLEAVED: ClassVar[bool] = True
    QK_NORM: ClassVar[str | bool] = "use_qk_norm"

    def _extras(self, cfg: Mapping) -> dict:
        return {"rope_compute_dtype": "float32"}

    def tiny_configs(self) -> dict[str, dict]:
        return {
            "default": tiny_base("cohere", rope_theta=500000.0, pad_token_id=0, bos_token_id=1, eos_token_id=2),
            "qk_norm": tiny_base("cohere", use_qk_norm=True, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        }


ADAPTER = CohereAdapter()
