"""Run decoder layers one at a time on chosen token rows against a K/V store.

The store holds, per layer, the full ``[B, H_kv, T, D]`` keys and values of a sequence (RoPE
applied, positions ``0..T-1`` or any increasing positions). :func:`run_layer` runs one of the
model's own decoder layers (its ``forward``, so norms, projections, RoPE and attention are the
model's) on the hidden states of some rows only: the layer's fresh K/V for those rows are
scattered into the store, and the rows attend to every store row whose position is not after
their own (causal by position). So a row recomputed after other context attends to that
context and to the other rows as a full prefill would, with whatever K/V the store holds for
the rows that are not recomputed.

Supported: decoder layers that take ``position_embeddings`` from the model's ``rotary_emb``
(the Llama family: Llama, Mistral, Qwen2/3, SmolLM2, the zoo). Others raise
:class:`~kvbridge.errors.UnsupportedModelError`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace

import torch

from kvbridge.errors import UnsupportedModelError


@dataclass(frozen=True)
class Parts:
    """The pieces of a decoder-only model that the runner drives."""

    embed: object
    layers: object
    rotary: object
    norm: object


def parts_of(model) -> Parts:
    base = getattr(model, getattr(model, "base_model_prefix", "model"), model)
    layers, embed, rotary = (getattr(base, name, None) for name in ("layers", "embed_tokens", "rotary_emb"))
    if layers is None or embed is None or rotary is None:
        raise UnsupportedModelError(
            f"{type(model).__name__}: selective recompute needs a decoder with embed_tokens, layers and rotary_emb",
            "use a Llama-family model (Llama, Mistral, Qwen2/3, SmolLM2) or plain reuse/full prefill",
        )
    if "position_embeddings" not in inspect.signature(layers[0].forward).parameters:
        raise UnsupportedModelError(
            f"{type(layers[0]).__name__} does not take position_embeddings",
            "use a Llama-family model for selective recompute",
        )
    if getattr(getattr(layers[0], "self_attn", None), "sliding_window", None):
        raise UnsupportedModelError(
            "sliding-window layers are not supported by selective recompute", "use a model with full attention"
        )
    return Parts(embed, layers, rotary, getattr(base, "norm", None))


class RowStore:
    """Per-layer K/V of the whole sequence; ``update`` scatters the rows being recomputed.

    Duck-types the one ``Cache`` method attention layers call (``update``).
    """

    def __init__(self, keys, values, positions: torch.Tensor):
        self.keys = [k.clone() for k in keys]
        self.values = [v.clone() for v in values]
        self.positions = positions  # [B, T]
        self.rows = None  # [B, k] rows being recomputed

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        b, h, _, d = key_states.shape
        idx = self.rows[:, None, :, None].expand(b, h, self.rows.shape[1], d)
        k = self.keys[layer_idx].to(key_states.dtype).scatter(2, idx, key_states)
        v = self.values[layer_idx].to(value_states.dtype).scatter(2, idx, value_states)
        self.keys[layer_idx], self.values[layer_idx] = k, v
        return k, v

    def mask(self, dtype) -> torch.Tensor:
        """Additive ``[B, 1, k, T]`` mask: row i sees store rows at positions <= its own."""
        qpos = self.positions.gather(1, self.rows)
        allowed = self.positions[:, None, :] <= qpos[:, :, None]
        zero = torch.zeros((), dtype=dtype, device=qpos.device)
        neg = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=qpos.device)
        return torch.where(allowed, zero, neg)[:, None]


def embed(model, ids: torch.Tensor) -> torch.Tensor:
    return parts_of(model).embed(ids)


def run_layer(model, layer: int, hidden: torch.Tensor, rows: torch.Tensor, store: RowStore) -> torch.Tensor:
    """Hidden states after ``layer`` for ``rows`` (``hidden [B, k, h]`` are their inputs)."""
    parts = parts_of(model)
    store.rows = rows
    pos = store.positions.gather(1, rows)
    with torch.no_grad():
        pe = parts.rotary(hidden, position_ids=pos)
        out = parts.layers[layer](
            hidden,
            attention_mask=store.mask(hidden.dtype),
            position_ids=pos,
            cache=store,
            use_cache=True,
            position_embeddings=pe,
        )
    return out[0] if isinstance(out, tuple) else out


def run_layers(model, layers, hidden, rows, store: RowStore) -> torch.Tensor:
    for layer in layers:
        hidden = run_layer(model, layer, hidden, rows, store)
    return hidden


def with_kv(state, keys, values, partial: bool, meta: dict):
    """``state`` holding ``keys`` / ``values`` (cast to its dtype), ``meta`` added; still approximate only
    when it was and the recompute was ``partial`` (not every row at every layer it needed)."""
    return replace(
        state,
        keys=tuple(k.to(state.dtype) for k in keys),
        values=tuple(v.to(state.dtype) for v in values),
        approximate=state.approximate and partial,
        meta={**state.meta, **meta},
    )
