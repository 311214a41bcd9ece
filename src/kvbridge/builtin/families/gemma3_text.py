"""Gemma 3 text decoder (``model_type`` ``gemma3_text``).

Two RoPE tables, one per layer type, in ``rope_parameters`` nested as
``{"sliding_attention": {...}, "full_attention": {...}}``. Legacy configs give the full-layer
base as ``rope_theta`` (default 1e6), the sliding-layer base as ``rope_local_base_freq``
(default 1e4), and ``rope_scaling`` (e.g. linear x8) for the *full* layers only. Layer ``i``
slides when ``(i + 1) % sliding_window_pattern`` (pattern default 6) unless ``layer_types`` is
given; ``use_bidirectional_attention`` turns the window into ``window // 2 + 1``.

Cache: ``num_key_value_heads`` (default 4), ``head_dim`` (default 256). RoPE half-split, whole
head; q/k RMSNorm before RoPE. Rotary module: ``model.model.rotary_emb``, called with the
layer type (``rot(x, position_ids, layer_type)``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar, Mapping

from kvbridge.builtin.families._common import (
    NEEDS_ORIGINAL_MAX,
    DecoderAdapter,
    check_positive_int,
    flag,
    get,
    layer_types_from,
    number,
    optional_positive_int,
    rope_spec,
    tiny_base,
)
from kvbridge.errors import ConfigError
from kvbridge.spec import FULL, SLIDING

GLOBAL_THETA = 1_000_000.0
LOCAL_THETA = 10_000.0


def gemma3_rope_parameters(cfg: Mapping, max_positions: int) -> dict[str, dict]:
    """``{"full_attention": {...}, "sliding_attention": {...}}`` as Gemma3TextConfig builds it."""
    model_type = cfg.get("model_type")
    given = cfg.get("rope_parameters")
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(
            f"config field 'rope_parameters' must be a mapping, got {given!r}",
            "give {'sliding_attention': {...}, 'full_attention': {...}}",
        )
    # only the two nested tables count: a flat dict here is ignored by transformers too
    tables = copy.deepcopy(dict(given)) if given else {}
    scaling = cfg.get("rope_scaling")
    for kind, theta_key, default_theta in (
        (FULL, "rope_theta", GLOBAL_THETA),
        (SLIDING, "rope_local_base_freq", LOCAL_THETA),
    ):
        table = tables.get(kind)
        if table is not None and not isinstance(table, Mapping):
            raise ConfigError(
                f"config field 'rope_parameters.{kind}' must be a mapping, got {table!r}",
                "give a dict with 'rope_type' and 'rope_theta'",
            )
        table = dict(table) if table else {"rope_type": "default"}
        if kind == FULL and scaling:
            table.update(copy.deepcopy(dict(scaling)))  # legacy scaling applies to global layers
        if table.get("rope_theta") is None:
            table["rope_theta"] = get(cfg, theta_key, default_theta)
        table["rope_theta"] = number(table["rope_theta"], theta_key, model_type)
        table["rope_type"] = str(table.get("rope_type") or table.get("type") or "default")
        table.pop("type", None)
        if table["rope_type"] in NEEDS_ORIGINAL_MAX and table.get("original_max_position_embeddings") is None:
            table["original_max_position_embeddings"] = max_positions
        tables[kind] = table
    return {FULL: tables[FULL], SLIDING: tables[SLIDING]}


@dataclass(frozen=True)
class Gemma3TextAdapter(DecoderAdapter):
    """Gemma 3 (1B text-only, and the text tower of the multimodal checkpoints)."""

    name: str = "gemma3_text"
    model_types: tuple = ("gemma3_text",)
    description: str = "Gemma 3: per-layer-type RoPE tables, 5:1 sliding/full, q/k norm"

    DEFAULT_VOCAB: ClassVar[int] = 262_208
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 131_072
    DEFAULT_KV_HEADS: ClassVar[int | None] = 4
    DEFAULT_HEAD_DIM: ClassVar[int | None] = 256
    DEFAULT_WINDOW: ClassVar[int | None] = 4096
    DEFAULT_PATTERN: ClassVar[int] = 6
    QK_NORM: ClassVar[bool] = True

    def _rope(self, cfg: Mapping, head_dim: int, max_positions: int):
        tables = {
            kind: rope_spec(params, head_dim=head_dim, max_position_embeddings=max_positions)
            for kind, params in gemma3_rope_parameters(cfg, max_positions).items()
        }
        return tables[FULL], tuple(sorted(tables.items()))

    def _layout(self, cfg: Mapping, num_layers: int):
        window = optional_positive_int(cfg, "sliding_window", self.DEFAULT_WINDOW)
        if window is not None and flag(cfg, "use_bidirectional_attention", False):
            window = window // 2 + 1  # Gemma3TextConfig stores the exclusive bound
        pattern = check_positive_int(
            get(cfg, "sliding_window_pattern", self.DEFAULT_PATTERN), "sliding_window_pattern", cfg.get("model_type")
        )
        default = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
        return window, layer_types_from(cfg, num_layers, default)

    def _extras(self, cfg: Mapping) -> dict:
        return {"use_bidirectional_attention": flag(cfg, "use_bidirectional_attention", False)}

    def tiny_configs(self) -> dict[str, dict]:
        common = dict(
            num_hidden_layers=4,
            head_dim=16,
            sliding_window=4,
            query_pre_attn_scalar=16,
            hidden_activation="gelu_pytorch_tanh",
            max_position_embeddings=128,
        )
        legacy = tiny_base(
            "gemma3_text",
            **common,
            sliding_window_pattern=3,
            rope_theta=1_000_000.0,
            rope_local_base_freq=10_000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
        )
        nested = tiny_base("gemma3_text", **common, layer_types=[SLIDING, FULL, SLIDING, FULL])
        nested.pop("rope_theta")
        nested["rope_parameters"] = {
            FULL: {"rope_type": "default", "rope_theta": 500_000.0},
            SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
        }
        return {"legacy": legacy, "nested": nested}


ADAPTER = Gemma3TextAdapter()
