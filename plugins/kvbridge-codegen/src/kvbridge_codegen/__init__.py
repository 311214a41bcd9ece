"""kvbridge plugin: the Salesforce CodeGen family (``model_type`` ``codegen``).

What the cache looks like (transformers ``models/codegen``):

- config names ``n_layer``, ``n_head``, ``n_embd``, ``n_positions`` (aliases
  ``num_hidden_layers`` ... are read too); every head is cached (no GQA), head dim
  ``n_embd // n_head``;
- one fused ``qkv_proj``, split per model-parallel shard (``mp_num = 4``) into query, *value*,
  key: ``n_embd`` must be a multiple of 4. The split happens before the cache, so cached K/V are
  ordinary ``[batch, heads, tokens, head_dim]`` tensors;
- RoPE on the first ``rotary_dim`` dims of each head, with **interleaved** pairs ``(2i, 2i+1)``
  (``rotate_every_two``), base fixed at 10000, from a precomputed sinusoid table of
  ``n_positions`` rows (``model.transformer.rotary_emb``).

So the adapter only has to say that in a :class:`~kvbridge.spec.ModelSpec`; extraction and
injection are the Hugging Face defaults of :class:`~kvbridge.family_adapter.FamilyAdapter`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import kvbridge.hookspecs
from kvbridge.family_adapter import FamilyAdapter, positive_int
from kvbridge.errors import ConfigError
from kvbridge.hookspecs import hookimpl
from kvbridge.spec import FULL, ModelSpec, RopeSpec

__version__ = "0.1.0"

THETA = 10000.0  # CodeGen's sinusoid table has a fixed base
MP_NUM = 4  # model-parallel shards the fused qkv_proj is interleaved across
MANIFESTS = Path(__file__).parent / "manifests"


def _partial_factor(rotary_dim: int, head_dim: int) -> float:
    """The smallest factor f with int(head_dim * f) == rotary_dim (exact rotary_dim for the codec)."""
    factor = rotary_dim / head_dim
    while int(head_dim * factor) < rotary_dim:
        factor = math.nextafter(factor, math.inf)
    return factor


def _dtype(config: Mapping) -> str:
    value = config.get("dtype") or config.get("torch_dtype") or "float32"
    return str(value).removeprefix("torch.")


@dataclass(frozen=True)
class CodeGenAdapter(FamilyAdapter):
    """Salesforce CodeGen (codegen-350M/2B/6B/16B, mono/multi/nl)."""

    name: str = "codegen"
    model_types: tuple = ("codegen",)
    description: str = "CodeGen: MHA, interleaved partial RoPE over rotary_dim, fused qkv_proj"

    def describe(self, config: Mapping) -> ModelSpec:
        cfg = dict(config)
        layers = positive_int(cfg, "n_layer", "num_hidden_layers")
        heads = positive_int(cfg, "n_head", "num_attention_heads")
        hidden = positive_int(cfg, "n_embd", "hidden_size")
        positions = positive_int(cfg, "n_positions", "max_position_embeddings") \
            if ("n_positions" in cfg or "max_position_embeddings" in cfg) else 2048
        if hidden % heads:
            raise ConfigError(f"config field 'n_embd' ({hidden}) is not a multiple of 'n_head' ({heads})",
                              "fix 'n_embd' or 'n_head' (model_type 'codegen')")
        if hidden % MP_NUM:
            raise ConfigError(f"config field 'n_embd' ({hidden}) is not a multiple of {MP_NUM}",
                              "CodeGen splits its fused qkv_proj over 4 shards: use a multiple of 4")
        head_dim = hidden // heads
        rotary_dim = cfg.get("rotary_dim", 64)
        if rotary_dim is None or isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) \
                or rotary_dim <= 0 or rotary_dim > head_dim or rotary_dim % 2:
            raise ConfigError(f"config field 'rotary_dim' must be an even integer in 2..{head_dim}, got {rotary_dim!r}",
                              "fix 'rotary_dim' (model_type 'codegen'; the published models use 32 or 64)")
        vocab = cfg.get("vocab_size", 50400)
        rope = RopeSpec(rope_type="default", theta=THETA, head_dim=head_dim,
                        partial_factor=_partial_factor(rotary_dim, head_dim), interleaved=True,
                        max_position_embeddings=positions)
        return ModelSpec(model_type="codegen", family=self.name, num_layers=layers, num_attention_heads=heads,
                         num_kv_heads=heads, head_dim=head_dim, hidden_size=hidden, positional="rope", rope=rope,
                         sliding_window=None, layer_types=(FULL,) * layers, qk_norm=False, dtype=_dtype(cfg),
                         vocab_size=int(vocab), max_position_embeddings=positions,
                         extras=(("fused_qkv", True), ("rotary_dim", rotary_dim)))

    def tiny_config(self) -> dict:
        return {"model_type": "codegen", "n_layer": 2, "n_embd": 64, "n_head": 4, "rotary_dim": 8,
                "n_positions": 64, "n_ctx": 64, "vocab_size": 128, "n_inner": 128, "resid_pdrop": 0.0,
                "embd_pdrop": 0.0, "attn_pdrop": 0.0, "dtype": "float32"}

    def tiny_configs(self) -> dict:
        full = dict(self.tiny_config(), rotary_dim=16)  # rotary over the whole head
        return {"partial": self.tiny_config(), "full_rotary": full}


ADAPTER = CodeGenAdapter()


@hookimpl
def kvbridge_register_families(register):
    """Register the CodeGen adapter."""
    register(ADAPTER)


if hasattr(kvbridge.hookspecs, "kvbridge_manifest_dirs"):  # kvbridge versions with the manifest hook

    @hookimpl
    def kvbridge_manifest_dirs():
        """Publish this package's model manifests (Salesforce/codegen-350M-mono)."""
        return [MANIFESTS]


__all__ = ["CodeGenAdapter", "ADAPTER", "MANIFESTS", "kvbridge_register_families"]
