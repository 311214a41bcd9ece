"""What recomputing costs: FLOPs counted from the model's own weights, and wall time.

FLOPs of one decoder layer on ``q`` query rows that attend to ``a`` keys in all (summed over
the rows): ``2 * q * (weights of the layer's linear maps) + 4 * a * (query heads * head dim)``
(scores and the weighted sum of values). A full prefill of ``T`` tokens runs every layer on
``T`` rows with ``a = T(T+1)/2``. Norms, RoPE, the embedding lookup and the language-model
head (one token in a prefill) are left out of both sides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbridge.recompute.runner import parts_of


def layer_linear_params(model, layer: int) -> int:
    return sum(m.weight.numel() for m in parts_of(model).layers[layer].modules() if isinstance(m, torch.nn.Linear))


def attn_width(model) -> int:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return int(cfg.num_attention_heads * head_dim)


def layer_flops(model, layer: int, queries: int, attended: int) -> float:
    """FLOPs of ``layer`` for ``queries`` rows attending to ``attended`` keys in all."""
    return 2.0 * queries * layer_linear_params(model, layer) + 4.0 * attended * attn_width(model)


def causal_pairs(t: int) -> int:
    return t * (t + 1) // 2


def prefill_flops(model, tokens: int, batch: int = 1) -> float:
    """FLOPs of a full prefill of ``tokens`` tokens (every layer, causal attention)."""
    n = model.config.num_hidden_layers
    return batch * sum(layer_flops(model, i, tokens, causal_pairs(tokens)) for i in range(n))


@dataclass(frozen=True)
class Cost:
    """FLOPs and wall time of a recompute, and the FLOPs of a full target prefill of the same tokens
    (the condition sets time that prefill themselves: ``time_share`` in their rows)."""

    flops: float = 0.0
    seconds: float = 0.0
    full_prefill_flops: float = 0.0
    layers_run: tuple = ()  # layers whose forward ran (some or all rows)
    rows_per_layer: tuple = ()  # rows recomputed per layer run (per sample)
    note: str = ""

    @property
    def flop_share(self) -> float:
        return self.flops / self.full_prefill_flops if self.full_prefill_flops else float("nan")
