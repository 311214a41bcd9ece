"""Mistral (``model_type`` ``mistral``).

Like Llama (GQA, half-split RoPE on the whole head, ``model.model.rotary_emb``), plus one
``sliding_window`` that transformers applies to *every* layer when it is set (the class
default is 4096 when the key is absent; ``null`` means full attention). A ``layer_types``
key is ignored by ``MistralModel`` (transformers only warns), so it is ignored here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from kvbridge.builtin.families._common import DecoderAdapter, tiny_base


@dataclass(frozen=True)
class MistralAdapter(DecoderAdapter):
    """Mistral 7B style models: GQA and a sliding window on all layers."""

    name: str = "mistral"
    model_types: tuple = ("mistral",)
    description: str = "Mistral: GQA, half-split RoPE, sliding window on every layer"

    DEFAULT_VOCAB: ClassVar[int] = 32000
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 4096 * 32
    DEFAULT_KV_HEADS: ClassVar[int | None] = 8
    DEFAULT_WINDOW: ClassVar[int | None] = 4096

    def _layout(self, cfg: Mapping, num_layers: int):
        return self._all_sliding_if_window(cfg, num_layers, self.DEFAULT_WINDOW)

    def tiny_configs(self) -> dict[str, dict]:
        return {
            "sliding": tiny_base("mistral", sliding_window=6),
            "full": tiny_base("mistral", sliding_window=None),
        }


ADAPTER = MistralAdapter()
