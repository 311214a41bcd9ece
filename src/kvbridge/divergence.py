"""How far apart two next-token distributions, or two token streams, are: the one home of the math.

Used by ``kvbridge eval`` (:mod:`kvbridge.evaluate.conditions`), ``diverge`` and ``ablate``
(:mod:`kvbridge.prefix`), ``transfer --compare`` and the guarded hand-off. All of it works on
the last dimension (the vocabulary) and in float64.

- :func:`kl` — ``KL(p ‖ q) = Σ p (log p − log q)`` from logits, clamped at 0 (rounding).
- :func:`nucleus` — top-p truncation, renormalised. **Tie rule**: the kept set is the smallest
  set of most probable tokens whose mass reaches ``top_p``, *plus every token as probable as
  the least probable one kept*. So the result depends on the probabilities only, never on
  how a sort orders equal values (the two rules this replaced kept an arbitrary one of two
  tied tokens, and could disagree with each other). ``top_p >= 1`` keeps everything.
- :func:`tv_top_p` — total variation ``½ Σ |p' − q'|`` of the two nucleus distributions.
- :func:`topk_overlap` — ``|top-k(p) ∩ top-k(q)|`` (as a count, or ``/ k``).
- :func:`first_divergence` — the first index where two token sequences differ (``None`` when
  one is a prefix of the other); :func:`first_divergence_steps` is the batched form.

Torch is imported when a function runs, so importing this module stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor


def log_probs(logits: "Tensor") -> "Tensor":
    """float64 log-softmax over the last dimension."""
    import torch

    return torch.log_softmax(logits.double(), dim=-1)


def kl(p_logits: "Tensor", q_logits: "Tensor", *, logp: "Tensor | None" = None,
       logq: "Tensor | None" = None) -> "Tensor":
    """``KL(p ‖ q)`` per row (nats), from logits (or precomputed float64 log-probs), clamped at 0."""
    lp = log_probs(p_logits) if logp is None else logp
    lq = log_probs(q_logits) if logq is None else logq
    return (lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0)


def nucleus(probs: "Tensor", top_p: float) -> "Tensor":
    """Top-p truncated, renormalised distributions (see the module docstring for the tie rule)."""
    import torch

    probs = probs.double()
    if top_p >= 1.0:
        return probs / probs.sum(-1, keepdim=True)
    if not top_p > 0.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    sorted_p, _ = torch.sort(probs, dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each rank
    n_keep = (before < top_p).sum(-1, keepdim=True).clamp_min(1)  # smallest prefix reaching top_p
    threshold = sorted_p.gather(-1, n_keep - 1)  # least probable kept value
    out = torch.where(probs >= threshold, probs, torch.zeros_like(probs))  # ties at the edge all kept
    return out / out.sum(-1, keepdim=True)


def tv_top_p(p_logits: "Tensor", q_logits: "Tensor", top_p: float, *, temperature: float = 1.0,
             p_nucleus: "Tensor | None" = None) -> "Tensor":
    """Total variation between the top-p truncated distributions of two logit rows (per row)."""
    import torch

    pn = nucleus(torch.softmax(p_logits.double() / temperature, -1), top_p) if p_nucleus is None else p_nucleus
    qn = nucleus(torch.softmax(q_logits.double() / temperature, -1), top_p)
    return 0.5 * (pn - qn).abs().sum(-1)


def topk_indices(logits: "Tensor", k: int) -> "Tensor":
    return logits.topk(min(int(k), logits.shape[-1]), dim=-1).indices


def topk_overlap(p_logits: "Tensor", q_logits: "Tensor", k: int, *, share: bool = True,
                 p_topk: "Tensor | None" = None) -> "Tensor":
    """``|top-k(p) ∩ top-k(q)|`` per row (divided by ``k`` when ``share``)."""
    a = topk_indices(p_logits, k) if p_topk is None else p_topk
    b = topk_indices(q_logits, k)
    count = (b[..., :, None] == a[..., None, :]).any(-1).double().sum(-1)
    return count / a.shape[-1] if share else count


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (over their common length), or ``None``."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def first_divergence_steps(tokens: "Tensor", ref: "Tensor") -> "Tensor":
    """Per row of ``[B, G]`` token ids: the first step that differs from ``ref``, ``G`` when none (float)."""
    import torch

    diff = tokens != ref
    steps = tokens.shape[1]
    first = torch.where(diff.any(1), diff.float().argmax(1), torch.full(diff.shape[:1], steps))
    return first.float()


__all__ = ["log_probs", "kl", "nucleus", "tv_top_p", "topk_indices", "topk_overlap", "first_divergence",
           "first_divergence_steps"]
