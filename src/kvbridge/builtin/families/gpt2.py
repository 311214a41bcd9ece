"""GPT-2 (``model_type`` ``gpt2``).

Config names: ``n_layer``, ``n_head``, ``n_embd``, ``n_positions`` (aliases
``num_hidden_layers`` ... are read too). Cache: all heads, head dim ``n_embd // n_head``.
Positions: learned absolute embeddings (``wpe``) added to the input -- cached keys carry no
rotation, so ``positional`` is ``"absolute"``, ``rope`` is None and :meth:`rotary_embedding`
returns None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from kvbridge.builtin.families._common import DecoderAdapter


@dataclass(frozen=True)
class GPT2Adapter(DecoderAdapter):
    """OpenAI GPT-2 (and DistilGPT-2)."""

    name: str = "gpt2"
    model_types: tuple = ("gpt2",)
    description: str = "GPT-2: MHA, learned absolute position embeddings (no RoPE)"

    LAYERS_KEYS: ClassVar[tuple] = ("n_layer", "num_hidden_layers")
    HEADS_KEYS: ClassVar[tuple] = ("n_head", "num_attention_heads")
    HIDDEN_KEYS: ClassVar[tuple] = ("n_embd", "hidden_size")
    MAX_POSITIONS_KEYS: ClassVar[tuple] = ("n_positions", "max_position_embeddings")
    DEFAULT_VOCAB: ClassVar[int] = 50257
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 1024
    HEAD_DIM_KEY: ClassVar[str | None] = None

    def _cache_kv_heads(self, cfg: Mapping, heads: int) -> int:
        return heads

    def _positional(self, cfg: Mapping) -> str:
        return "absolute"

    def rotary_embedding(self, model, layer: int = 0):
        return None

    def tiny_configs(self) -> dict[str, dict]:
        return {
            "default": {
                "model_type": "gpt2",
                "n_layer": 2,
                "n_embd": 64,
                "n_head": 4,
                "n_positions": 64,
                "vocab_size": 128,
                "n_inner": 128,
                "resid_pdrop": 0.0,
                "embd_pdrop": 0.0,
                "attn_pdrop": 0.0,
                "bos_token_id": 0,
                "eos_token_id": 0,
                "dtype": "float32",
            }
        }


ADAPTER = GPT2Adapter()
