"""The one home of KL, top-p total variation, top-k overlap and first divergence."""

from __future__ import annotations

import math

import pytest
import torch

from kvbridge import divergence as dv


def test_kl_matches_the_definition_and_is_zero_on_itself():
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    want = sum(a * math.log(a / b) for a, b in zip(p.tolist(), q.tolist()))
    assert float(dv.kl(p.log(), q.log())) == pytest.approx(want, abs=1e-12)
    x = torch.randn(4, 50)
    assert torch.all(dv.kl(x, x) == 0)
    assert torch.all(dv.kl(x, x + 3.0) < 1e-12)  # logits are defined up to a constant


def test_nucleus_keeps_every_token_tied_at_the_edge():
    # 0.4 + 0.3 reaches top_p=0.6 with the second token; the third is tied with it and is kept too
    probs = torch.tensor([0.4, 0.3, 0.3], dtype=torch.float64)
    got = dv.nucleus(probs, 0.6)
    assert torch.allclose(got, probs)  # all three kept (a tie rule by sort order would drop one)
    # the result depends on the probabilities only, not on where the tied tokens sit
    perm = torch.tensor([2, 0, 1])
    assert torch.equal(dv.nucleus(probs[perm], 0.6), got[perm])
    # no tie: the smallest set whose mass reaches top_p
    probs = torch.tensor([0.1, 0.5, 0.25, 0.15], dtype=torch.float64)
    assert torch.allclose(dv.nucleus(probs, 0.7), torch.tensor([0, 0.5, 0.25, 0], dtype=torch.float64) / 0.75)
    assert torch.allclose(dv.nucleus(probs, 0.5), torch.tensor([0, 1.0, 0, 0], dtype=torch.float64))
    assert torch.allclose(dv.nucleus(probs, 1.0), probs)


def test_nucleus_agrees_with_the_plain_rule_when_nothing_ties():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(8, 300, generator=g, dtype=torch.float64), -1)
    for top_p in (0.1, 0.5, 0.9, 0.99):
        sorted_p, order = probs.sort(-1, descending=True)
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, (sorted_p.cumsum(-1) - sorted_p) < top_p)
        plain = probs * keep
        assert torch.allclose(dv.nucleus(probs, top_p), plain / plain.sum(-1, keepdim=True))


def test_tv_top_p_is_a_distance():
    a, b = torch.randn(3, 40), torch.randn(3, 40)
    tv = dv.tv_top_p(a, b, 0.9)
    assert torch.all(tv >= 0) and torch.all(tv <= 1) and torch.all(dv.tv_top_p(a, a, 0.9) == 0)
    assert torch.allclose(tv, dv.tv_top_p(b, a, 0.9))


def test_topk_overlap_and_first_divergence():
    a = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]])
    b = torch.tensor([[5.0, 1.0, 4.0, 2.0, 3.0]])  # top-3: {0, 2, 4} vs {0, 1, 2}
    assert float(dv.topk_overlap(a, b, 3, share=False)) == 2 and float(dv.topk_overlap(a, b, 3)) == 2 / 3
    assert dv.first_divergence([1, 2, 3], [1, 2, 4]) == 2 and dv.first_divergence([1, 2], [1, 2, 3]) is None
    steps = dv.first_divergence_steps(torch.tensor([[1, 2, 3], [1, 2, 3]]), torch.tensor([[1, 9, 3], [1, 2, 3]]))
    assert steps.tolist() == [1.0, 3.0]


def test_eval_and_the_sampler_use_the_same_tie_rule():
    from kvbridge.evaluate.conditions import position_fields
    from kvbridge.prefix.diverge import Sampler

    logits = torch.tensor([[[math.log(0.4), math.log(0.3), math.log(0.3)]]])
    assert torch.allclose(Sampler(1.0, 0.6).probs(logits[0, 0]), torch.tensor([0.4, 0.3, 0.3], dtype=torch.float64))
    _, native = position_fields(logits, torch.tensor([[0]]), None, top_k=2, top_p=0.6)
    assert torch.allclose(native["nucleus"][0, 0], torch.tensor([0.4, 0.3, 0.3], dtype=torch.float64))


def _adversarial_rows(vocab: int) -> torch.Tensor:
    """Rows built to break a shortcut: ties at every rank, flat rows, a tie straddling the prefix's
    end, mass that reaches top_p exactly at rank k, zeros, one-hot, and random peaky/flat ones."""
    g = torch.Generator().manual_seed(1)
    rows = [torch.full((vocab,), 1.0 / vocab, dtype=torch.float64)]  # flat: every token tied
    steps = torch.zeros(vocab, dtype=torch.float64)
    steps[:8], steps[8:40], steps[40:] = 0.05, 0.01, 0.0  # two tied plateaus, the rest zero
    rows.append(steps / steps.sum())
    edge = torch.zeros(vocab, dtype=torch.float64)
    edge[:63] = 0.9 / 63  # the first 63 ranks hold exactly 0.9 (up to rounding)...
    edge[63:70] = 0.1 / 7  # ...and a tie of 7 straddles rank 64
    rows.append(edge)
    straddle = torch.full((vocab,), 0.5 / (vocab - 70), dtype=torch.float64)
    straddle[:70] = 0.5 / 70  # 70 equal heads: the prefix ends inside the tie
    rows.append(straddle)
    one_hot = torch.zeros(vocab, dtype=torch.float64)
    one_hot[vocab // 2] = 1.0
    rows.append(one_hot)
    quantised = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64).mul(3).round(), -1)  # many ties
    rows.append(quantised)
    for scale in (0.1, 1.0, 4.0, 12.0):  # flat .. peaky
        rows.append(torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * scale, -1))
    out = torch.stack(rows)
    return out[:, torch.randperm(vocab, generator=g)]  # tied tokens scattered over the vocabulary


@pytest.mark.parametrize("vocab", [50, 1024, 9000])
def test_fast_nucleus_threshold_equals_the_full_sort_definition(vocab):
    rows = _adversarial_rows(vocab)
    for top_p in (1e-9, 0.05, 0.5, 0.9, 0.9 + 1e-12, 0.999, 1 - 1e-12, 1 - 1e-17):
        want = dv.nucleus_threshold_sorted(rows, top_p)
        for k in (None, 0, 1, 8, 63, 64, 65, vocab - 1, vocab):
            got = dv.nucleus_threshold(rows, top_p, prefix_k=k)
            assert torch.equal(got, want), (vocab, top_p, k)
    # and the whole nucleus: the reference masking of the full sort
    for top_p in (0.5, 0.9, 0.999):
        ref = rows.masked_fill(rows < dv.nucleus_threshold_sorted(rows, top_p), 0.0)
        assert torch.equal(dv.nucleus(rows, top_p), ref / ref.sum(-1, keepdim=True))


def test_fast_nucleus_handles_batches_and_falls_back_off_the_fast_path():
    g = torch.Generator().manual_seed(2)
    probs = torch.softmax(torch.randn(3, 5, 9000, generator=g, dtype=torch.float64) * 3, -1)
    want = dv.nucleus_threshold_sorted(probs, 0.9)
    assert dv.nucleus_threshold(probs, 0.9).shape == (3, 5, 1)
    assert torch.equal(dv.nucleus_threshold(probs, 0.9), want)
    assert torch.equal(dv.nucleus_threshold(probs.float(), 0.9), dv.nucleus_threshold_sorted(probs.float(), 0.9))
    bad = probs.clone()
    bad[0, 0, 0] = float("nan")  # not the fast path's input: the reference decides
    assert torch.equal(dv.nucleus_threshold(bad, 0.9).isnan(), dv.nucleus_threshold_sorted(bad, 0.9).isnan())
