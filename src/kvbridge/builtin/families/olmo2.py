"""OLMo 2 (``model_type`` ``olmo2``).

Cache: ``num_key_value_heads`` (default = query heads), ``head_dim`` explicit else
``hidden_size // num_attention_heads``. RoPE: half-split, whole head,
``model.model.rotary_emb``. q/k RMSNorm before RoPE, over the *whole* projection
(``num_heads * head_dim`` wide, not per head) -- ``extras["qk_norm_scope"] == "projection"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from kvbridge.builtin.families._common import DecoderAdapter, tiny_base


@dataclass(frozen=True)
class Olmo2Adapter(DecoderAdapter):
    """AllenAI OLMo 2."""

    name: str = "olmo2"
    model_types: tuple = ("olmo2",)
    description: str = "OLMo 2: half-split RoPE, q/k RMSNorm over the whole projection"

    DEFAULT_VOCAB: ClassVar[int] = 50304
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 2048
    QK_NORM: ClassVar[str | bool] = True

    def _extras(self, cfg: Mapping) -> dict:
        return {"qk_norm_scope": "projection"}

    def tiny_configs(self) -> dict[str, dict]:
        return {"default": tiny_base("olmo2", pad_token_id=0, eos_token_id=1)}


ADAPTER = Olmo2Adapter()
