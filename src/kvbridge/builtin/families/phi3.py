"""Phi-3 / Phi-3.5 / Phi-4-mini (``model_type`` ``phi3``).

Cache: ``num_key_value_heads`` (default = query heads), ``head_dim`` explicit else
``hidden_size // num_attention_heads``. RoPE: half-split over the first
``partial_rotary_factor`` of the head (default 1.0; Phi-4-mini 0.75), ``model.model.rotary_emb``.
Rope types: ``default`` or ``longrope`` only (legacy ``"su"`` and ``"yarn"`` mean longrope);
``original_max_position_embeddings`` is read from the *top level* of the config (class default
4096), overriding the value inside ``rope_scaling``. ``sliding_window`` (default none), when
set, applies to every layer as in Mistral.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from kvbridge.builtin.families._common import (
    DecoderAdapter,
    NEEDS_ORIGINAL_MAX,
    check_positive_int,
    get,
    tiny_base,
)
from kvbridge.errors import ConfigError

LEGACY_LONGROPE = ("su", "yarn")


@dataclass(frozen=True)
class Phi3Adapter(DecoderAdapter):
    """Microsoft Phi-3 family (4k, 128k longrope, Phi-3.5, Phi-4-mini)."""

    name: str = "phi3"
    model_types: tuple = ("phi3",)
    description: str = "Phi-3: half-split RoPE, longrope scaling, optional sliding window on all layers"

    DEFAULT_VOCAB: ClassVar[int] = 32064
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 4096
    DEFAULT_ORIGINAL_MAX: ClassVar[int] = 4096
    PARTIAL_ROTARY: ClassVar[bool] = True
    DEFAULT_PARTIAL: ClassVar[float | None] = 1.0
    ALL_SLIDING: ClassVar[bool] = True

    def _rope_parameters(self, cfg: Mapping, max_positions: int) -> dict:
        original = check_positive_int(
            get(cfg, "original_max_position_embeddings", self.DEFAULT_ORIGINAL_MAX),
            "original_max_position_embeddings",
            cfg.get("model_type"),
        )
        params = super()._rope_parameters(cfg, max_positions)
        if params["rope_type"] in NEEDS_ORIGINAL_MAX:  # Phi3 reads it from the top level, over rope_scaling's
            params["original_max_position_embeddings"] = original
        if params["rope_type"] in LEGACY_LONGROPE:
            params["rope_type"] = "longrope"
            if "original_max_position_embeddings" not in params:  # "su" was not standardised
                params["original_max_position_embeddings"] = original
        if params["rope_type"] not in ("default", "longrope"):
            raise ConfigError(
                f"phi3 rope type must be 'default' or 'longrope', got {params['rope_type']!r}",
                "fix 'rope_scaling' / 'rope_parameters' in the config",
            )
        return params

    def _extras(self, cfg: Mapping) -> dict:
        return {
            "original_max_position_embeddings": get(cfg, "original_max_position_embeddings", self.DEFAULT_ORIGINAL_MAX)
        }

    def tiny_configs(self) -> dict[str, dict]:
        half = 8  # head_dim 16 -> 8 longrope factors
        ids = dict(resid_pdrop=0.0, embd_pdrop=0.0, pad_token_id=0, eos_token_id=1, bos_token_id=1)
        return {
            "default": tiny_base("phi3", **ids),
            "longrope": tiny_base(
                "phi3",
                max_position_embeddings=32,
                original_max_position_embeddings=8,
                **ids,
                rope_scaling={
                    "type": "longrope",
                    "short_factor": [1.0 + 0.1 * i for i in range(half)],
                    "long_factor": [2.0 + 0.5 * i for i in range(half)],
                },
            ),
            "partial_sliding": tiny_base("phi3", partial_rotary_factor=0.75, sliding_window=6, **ids),
        }


ADAPTER = Phi3Adapter()
