"""GPT-J (``model_type`` ``gptj``).

Config names: ``n_layer``, ``n_head``, ``n_embd``, ``n_positions`` (the transformers aliases
``num_hidden_layers`` ... are read too). Cache: all heads, head dim ``n_embd // n_head``.
RoPE: *interleaved* pairs ``(2i, 2i+1)`` (``rotate_every_two``) over the first ``rotary_dim``
dims (default 64; ``null`` = the whole head), fixed base 10000 (GPT-J has no rope parameters).
Rotary module: ``model.transformer.rotary_emb``, which is unlike the others: it holds a
precomputed ``embed_positions`` table of ``n_positions`` rows and returns ``(sin, cos)`` at half
width (``rotary_dim // 2``), repeat-interleaved inside attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from kvbridge.builtin.families._common import (
    DecoderAdapter,
    check_positive_int,
    get,
    rope_spec,
    rotary_fraction,
)
from kvbridge.errors import ConfigError

THETA = 10000.0


@dataclass(frozen=True)
class GPTJAdapter(DecoderAdapter):
    """EleutherAI GPT-J-6B and relatives."""

    name: str = "gptj"
    model_types: tuple = ("gptj",)
    description: str = "GPT-J: MHA, interleaved partial RoPE over rotary_dim, base 10000"

    LAYERS_KEYS: ClassVar[tuple] = ("n_layer", "num_hidden_layers")
    HEADS_KEYS: ClassVar[tuple] = ("n_head", "num_attention_heads")
    HIDDEN_KEYS: ClassVar[tuple] = ("n_embd", "hidden_size")
    MAX_POSITIONS_KEYS: ClassVar[tuple] = ("n_positions", "max_position_embeddings")
    DEFAULT_VOCAB: ClassVar[int] = 50400
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 2048
    DEFAULT_ROTARY_DIM: ClassVar[int] = 64
    HEAD_DIM_KEY: ClassVar[str | None] = None
    MHA: ClassVar[bool] = True
    INTERLEAVED: ClassVar[bool] = True

    def _rotary_dim(self, cfg: Mapping, head_dim: int) -> int:
        rotary_dim = get(cfg, "rotary_dim", self.DEFAULT_ROTARY_DIM)
        if rotary_dim is None:
            return head_dim
        check_positive_int(rotary_dim, "rotary_dim", cfg.get("model_type"))
        if rotary_dim > head_dim or rotary_dim % 2:
            raise ConfigError(
                f"config field 'rotary_dim' must be even and <= head dim {head_dim}, got {rotary_dim}",
                "fix 'rotary_dim' in the config (model_type 'gptj')",
            )
        return rotary_dim

    def _rope(self, cfg: Mapping, head_dim: int, max_positions: int):
        rotary_dim = self._rotary_dim(cfg, head_dim)
        params = {"rope_type": "default", "rope_theta": THETA}
        return rope_spec(
            params,
            head_dim=head_dim,
            partial_factor=rotary_fraction(rotary_dim, head_dim),
            interleaved=True,
            max_position_embeddings=max_positions,
        ), ()

    def tiny_configs(self) -> dict[str, dict]:
        return {
            "default": {
                "model_type": "gptj",
                "n_layer": 2,
                "n_embd": 64,
                "n_head": 4,
                "rotary_dim": 8,
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


ADAPTER = GPTJAdapter()
