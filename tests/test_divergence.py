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
