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
  :func:`nucleus_threshold` finds the edge from the top-k prefix where that decides it and sorts
  values only for the other rows; the same numbers as the full sort (:func:`nucleus_threshold_sorted`).
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


def kl(
    p_logits: "Tensor",
    q_logits: "Tensor",
    *,
    logp: "Tensor | None" = None,
    logq: "Tensor | None" = None,
    p: "Tensor | None" = None,
) -> "Tensor":
    """``KL(p ‖ q)`` per row (nats), from logits (or precomputed float64 log-probs; ``p`` = ``logp.exp()``
    when the caller has it), clamped at 0."""
    lp = log_probs(p_logits) if logp is None else logp
    lq = log_probs(q_logits) if logq is None else logq
    return ((lp.exp() if p is None else p) * (lp - lq)).sum(-1).clamp_min(0.0)


#: the fast path's first try: the ``PREFIX_K`` most probable tokens (``torch.topk``), used when the
#: vocabulary is at least ``PREFIX_MIN_VOCAB`` (below it, sorting the values is as cheap)
PREFIX_K = 64
PREFIX_MIN_VOCAB = 8192
#: a row's top-k prefix decides its nucleus only when its mass reaches ``top_p`` by this much more
#: (far above the rounding of a float64 cumulative sum, so the ranks after it cannot count)
PREFIX_MARGIN = 1e-9


def _sorted_desc(probs: "Tensor") -> "Tensor":
    """The values of each row in descending order (what ``torch.sort(descending=True)`` gives).

    Sorting values alone (numpy's vectorised sort on CPU) is 3-4x faster than ``torch.sort``,
    which also computes the permutation; equal values are indistinguishable, so the sorted
    values are the same numbers in the same places. Elsewhere (or with NaN), ``torch.sort``.
    """
    import torch

    if probs.device.type == "cpu" and probs.dtype == torch.float64 and not torch.isnan(probs).any():
        import numpy as np

        return torch.from_numpy(np.sort(probs.detach().contiguous().numpy(), axis=-1)).flip(-1)  # ascending, flipped
    return torch.sort(probs, dim=-1, descending=True).values


def _edge(sorted_p: "Tensor", top_p: float) -> "Tensor":
    """The least probable kept value per row, from (a prefix of) the descending values."""
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each rank
    n_keep = (before < top_p).sum(-1, keepdim=True).clamp_min(1)  # smallest prefix reaching top_p
    return sorted_p.gather(-1, n_keep - 1)


def nucleus_threshold(probs: "Tensor", top_p: float, *, prefix_k: int | None = None) -> "Tensor":
    """``[..., 1]``: the least probable value :func:`nucleus` keeps in each row (every value ``>=`` it is kept).

    Definition (the reference, :func:`nucleus_threshold_sorted`): sort the row descending, take
    the cumulative mass strictly before each rank, count the ranks where it is below ``top_p``
    (at least one); the value at the last such rank is the threshold.

    Fast path, the same numbers (CPU, float64, rows of non-negative values): the ``k`` largest
    values (``torch.topk``, sorted) are exactly the first ``k`` of the full sort, and a CPU
    cumulative sum is sequential, so their cumulative masses are the full sort's first ``k``
    bit for bit. When a row's mass over them reaches ``top_p + PREFIX_MARGIN``, every later
    rank has at least that much before it, so none of them counts: the prefix gives the same
    count and the same threshold. Other rows (flat distributions, ``top_p`` near 1, ties
    straddling rank ``k``) get the full sort of their values. ``prefix_k``: ``k`` (default
    ``PREFIX_K`` when the vocabulary is at least ``PREFIX_MIN_VOCAB``, else no prefix step).
    """
    import torch

    vocab = probs.shape[-1]
    if prefix_k is None:
        prefix_k = PREFIX_K if vocab >= PREFIX_MIN_VOCAB else 0
    exact_ok = probs.device.type == "cpu" and probs.dtype == torch.float64 and bool((probs >= 0).all())
    if not exact_ok:  # the reference (the fast path's argument needs sequential sums of non-negative values)
        return nucleus_threshold_sorted(probs, top_p)
    lead, rows = probs.shape[:-1], probs.reshape(-1, vocab)
    if prefix_k <= 0 or prefix_k >= vocab or rows.shape[0] == 0:
        return _edge(_sorted_desc(rows), top_p).reshape(*lead, 1)
    top = rows.topk(prefix_k, dim=-1, sorted=True).values
    out = _edge(top, top_p)
    rest = (top.cumsum(-1)[:, -1] < top_p + PREFIX_MARGIN).nonzero().flatten()
    if rest.numel():
        out[rest] = _edge(_sorted_desc(rows[rest]), top_p)
    return out.reshape(*lead, 1)


def nucleus_threshold_sorted(probs: "Tensor", top_p: float) -> "Tensor":
    """The reference definition of :func:`nucleus_threshold`: a full ``torch.sort`` of every row."""
    import torch

    return _edge(torch.sort(probs, dim=-1, descending=True).values, top_p)


def nucleus(probs: "Tensor", top_p: float) -> "Tensor":
    """Top-p truncated, renormalised distributions (see the module docstring for the tie rule)."""
    probs = probs.double()
    if top_p >= 1.0:
        return probs / probs.sum(-1, keepdim=True)
    if not top_p > 0.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    out = probs.masked_fill(probs < nucleus_threshold(probs, top_p), 0.0)  # ties at the edge all kept
    return out / out.sum(-1, keepdim=True)


def tv(p_nucleus: "Tensor", q_nucleus: "Tensor") -> "Tensor":
    """Total variation ``½ Σ |p − q|`` of two (nucleus) distributions, per row."""
    return 0.5 * (p_nucleus - q_nucleus).abs().sum(-1)


def tv_top_p(p_logits: "Tensor", q_logits: "Tensor", top_p: float, *, temperature: float = 1.0) -> "Tensor":
    """Total variation between the top-p truncated distributions of two logit rows (per row)."""
    import torch

    pn = nucleus(torch.softmax(p_logits.double() / temperature, -1), top_p)
    qn = nucleus(torch.softmax(q_logits.double() / temperature, -1), top_p)
    return tv(pn, qn)


def topk_indices(logits: "Tensor", k: int) -> "Tensor":
    return logits.topk(min(int(k), logits.shape[-1]), dim=-1).indices


def topk_overlap(
    p_logits: "Tensor", q_logits: "Tensor", k: int, *, share: bool = True, p_topk: "Tensor | None" = None
) -> "Tensor":
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
    return torch.where(diff.any(1), diff.float().argmax(1), torch.full(diff.shape[:1], tokens.shape[1])).float()
