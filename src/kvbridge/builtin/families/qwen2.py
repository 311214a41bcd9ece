"""Qwen2 / Qwen2.5 (``model_type`` ``qwen2``).

Cache: ``num_key_value_heads`` (GQA; class default 32 when absent), head dim ``head_dim`` if the
config has one, else ``hidden_size // num_attention_heads``. RoPE: half-split, whole head,
``model.model.rotary_emb``. Sliding window, as ``Qwen2Config`` decides it: ``sliding_window``
counts only when ``use_sliding_window`` is true, and then only layers
``i >= max_window_layers`` slide (an explicit ``layer_types`` wins). Published Qwen2/2.5
checkpoints ship ``use_sliding_window: false``: all layers full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from kvbridge.builtin.families._common import (
    DecoderAdapter,
    flag,
    get,
    layer_types_from,
    optional_positive_int,
    tiny_base,
)
from kvbridge.errors import ConfigError
from kvbridge.spec import FULL, SLIDING


def qwen_layout(
    cfg: Mapping, num_layers: int, *, default_window: int = 4096, default_max_window_layers: int = 28
) -> tuple:
    """(window, layer types) the way Qwen2Config / Qwen3Config compute them."""
    window = optional_positive_int(cfg, "sliding_window", default_window)
    if not flag(cfg, "use_sliding_window", False):
        window = None
    max_window_layers = get(cfg, "max_window_layers", default_max_window_layers)
    if isinstance(max_window_layers, bool) or not isinstance(max_window_layers, int) or max_window_layers < 0:
        raise ConfigError(
            f"config field 'max_window_layers' must be an integer >= 0, got {max_window_layers!r}",
            "set 'max_window_layers' to the number of leading full-attention layers",
        )
    default = [SLIDING if window is not None and i >= max_window_layers else FULL for i in range(num_layers)]
    return window, layer_types_from(cfg, num_layers, default)


@dataclass(frozen=True)
class Qwen2Adapter(DecoderAdapter):
    """Qwen2 and Qwen2.5 dense models."""

    name: str = "qwen2"
    model_types: tuple = ("qwen2",)
    description: str = "Qwen2/2.5: GQA, half-split RoPE, optional sliding window above max_window_layers"

    DEFAULT_VOCAB: ClassVar[int] = 151936
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 32768
    DEFAULT_KV_HEADS: ClassVar[int | None] = 32

    def _layout(self, cfg: Mapping, num_layers: int):
        return qwen_layout(cfg, num_layers)

    def _extras(self, cfg: Mapping) -> dict:
        return {"use_sliding_window": flag(cfg, "use_sliding_window", False)}

    def tiny_configs(self) -> dict[str, dict]:
        return {
            "default": tiny_base("qwen2", sliding_window=32768, use_sliding_window=False, max_window_layers=2),
            # layer 0 full, layers 1-2 slide over 4 tokens
            "sliding": tiny_base(
                "qwen2", num_hidden_layers=3, use_sliding_window=True, sliding_window=4, max_window_layers=1
            ),
        }


ADAPTER = Qwen2Adapter()
