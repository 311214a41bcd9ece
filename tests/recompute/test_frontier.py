"""The compute frontier (``kvbridge eval --frontier``): its ends, its positions, its costs and its verdict."""

from __future__ import annotations

import math

import pytest
import torch

from kvbridge.evaluate.settings import EvalSettings
from kvbridge.run import model_run
from kvbridge.recompute.frontier import kept_rows, point_name, run_frontier, truncated_state, verdict
from kvbridge.recompute.tokens import recompute_rows

from .conftest import adapter, cont_logits


def _ids(model, n, t, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (n, t), generator=g)


def test_kept_rows_are_the_sinks_and_the_tail():
    assert kept_rows(20, 0.25, 4, tail=True).tolist() == [0, 1, 2, 3, 15, 16, 17, 18, 19]
    assert kept_rows(20, 0.25, 4, tail=False).tolist() == [0, 1, 2, 3, 15, 16, 17, 18, 19]
    assert kept_rows(20, 0.0, 4, tail=True).tolist() == []  # tail@0: nothing computed, the plain transfer
    assert kept_rows(20, 0.0, 4, tail=False).tolist() == [0, 1, 2, 3]  # truncated@0: the sinks alone
    assert kept_rows(20, 0.9, 4, tail=True).tolist() == list(range(20))  # sinks and tail overlap: every row once
    assert kept_rows(20, 1.0, 0, tail=False).tolist() == list(range(20))
    assert kept_rows(20, 0.1, 0, tail=True).tolist() == [18, 19]


def _pair(zoo_stranger, zoo_base, n=2, p=24):
    from kvbridge.transfer import identity_transfer

    ids = _ids(zoo_base, n, p, 7)
    transferred = identity_transfer(adapter(zoo_stranger).extract(zoo_stranger, ids))
    native = adapter(zoo_base).extract(zoo_base, ids)
    return transferred, native


def test_the_ends_of_the_frontier(zoo_base, zoo_stranger):
    """tail@0 is the transfer bitwise (nothing runs); tail@1 and truncated@1 are the target's own prefill, within
    1e-5 (the runner's explicit-mask attention sums in another order than the model's prefill: not bitwise)."""
    transferred, native = _pair(zoo_stranger, zoo_base)
    cont = _ids(zoo_base, 2, 5, 8)
    p = native.num_tokens
    tail0, cost0 = recompute_rows(zoo_base, transferred, kept_rows(p, 0.0, 4, tail=True))
    assert tail0 is transferred and cost0.flops == 0
    assert torch.equal(cont_logits(zoo_base, tail0, cont), cont_logits(zoo_base, transferred, cont))
    want = cont_logits(zoo_base, native, cont)
    tail1, cost1 = recompute_rows(zoo_base, transferred, kept_rows(p, 1.0, 4, tail=True))
    trunc1, tcost1 = truncated_state(zoo_base, native, kept_rows(p, 1.0, 4, tail=False))
    for state, cost in ((tail1, cost1), (trunc1, tcost1)):
        assert (cont_logits(zoo_base, state, cont) - want).abs().max().item() <= 1e-5
        for got, ref in zip(state.keys, native.keys):
            assert torch.allclose(got, ref, atol=1e-5)
        assert cost.flop_share == pytest.approx(1.0)  # every row at every layer: a full prefill's FLOPs
    from dataclasses import replace

    mapped = replace(transferred, approximate=True)  # what a fitted mapping's transfer marks
    assert not recompute_rows(zoo_base, mapped, kept_rows(p, 1.0, 4, tail=True))[0].approximate
    assert recompute_rows(zoo_base, mapped, kept_rows(p, 0.5, 4, tail=True))[0].approximate


def test_truncated_keeps_the_original_positions(tiny):
    """truncated@R: the kept tokens sit at their positions in the full prefix and the continuation at P..P+C-1;
    the sinks attend only to themselves, so their K/V are the full prefill's."""
    ad = adapter(tiny)
    p, c = 20, 4
    ids, cont = _ids(tiny, 2, p, 3), _ids(tiny, 2, c, 4)
    native = ad.extract(tiny, ids)
    rows = kept_rows(p, 0.25, 4, tail=False)
    state, cost = truncated_state(tiny, native, rows)
    assert state.positions.tolist() == [rows.tolist()] * 2 and state.num_tokens == 9
    for got, ref in zip(state.keys, native.keys):
        assert torch.allclose(got[:, :, :4], ref[:, :, :4], atol=1e-6)
    from kvbridge.recompute.cost import prefill_flops

    assert cost.flop_share == pytest.approx(1.0)  # a full prefill of the 9 kept tokens ...
    assert 0 < cost.flops / prefill_flops(tiny, p, batch=2) < 9 / 20  # ... under 9/20 of the whole prefix's
    pos = torch.arange(p, p + c).expand(2, c)
    with torch.no_grad():
        got = tiny(input_ids=cont, cache=ad.inject(state, tiny, check=False), position_ids=pos, use_cache=True).logits
        # the reference: one forward over the kept tokens and the continuation, positions given, nothing cached
        kept_ids = torch.cat([ids[:, rows], cont], 1)
        kept_pos = torch.cat([rows.expand(2, -1), pos], 1)
        ref = tiny(input_ids=kept_ids, position_ids=kept_pos, attention_mask=torch.ones_like(kept_ids)).logits[:, -c:]
        moved = tiny(input_ids=cont, cache=ad.inject(state, tiny, check=False), use_cache=True).logits
    assert (got - ref).abs().max().item() <= 1e-5
    assert (moved - ref).abs().max().item() > 1e-4  # the positions matter: without them the continuation moves


def test_run_frontier_rows_costs_and_ends(zoo_base, zoo_stranger):
    from kvbridge.builtin.identity import IdentityFitter

    sspec, tspec = adapter(zoo_stranger).spec_of(zoo_stranger), adapter(zoo_base).spec_of(zoo_base)
    mapping = IdentityFitter().fit(sspec, tspec)
    ids = _ids(zoo_base, 4, 16 + 4 + 1, 31)
    settings = EvalSettings(
        mapping="identity",
        corpus="-",
        prefix_len=16,
        continuation_len=4,
        frontier="1,0.5,0",
        sink=2,
        attention=False,
        bootstrap=30,
        batch_size=3,
    )
    out = run_frontier(model_run(zoo_stranger, zoo_base, settings), mapping, ids)
    c = out["conditions"]
    assert list(c) == [
        "native",
        "source",
        "transferred",
        "truncated@0",
        "tail@0",
        "truncated@0.5",
        "tail@0.5",
        "truncated@1",
        "tail@1",
        "no_prefix",
    ]
    assert out["ratios"] == [0.0, 0.5, 1.0] and out["positions"] == "original"
    assert c["tail@0"]["nll"] == c["transferred"]["nll"] and c["tail@0"]["flop_share"] == 0
    for name in ("tail@1", "truncated@1"):
        assert c[name]["kl_p95"] < 1e-6 and c[name]["flop_share"] == pytest.approx(1.0)
        assert c[name]["gap_recovered"] == pytest.approx(1.0, abs=1e-4)
    assert c["transferred"]["kl_p95"] > 1e-3
    assert 0 < c["truncated@0.5"]["flop_share"] < c["tail@0.5"]["flop_share"] < 1  # same rows, fewer keys attended
    assert c["truncated@0.5"]["rows_computed"] == c["tail@0.5"]["rows_computed"] == 10
    assert c["tail@0.5"]["source_flop_share"] > 0 and c["truncated@0.5"]["source_flop_share"] == 0
    d = c["tail@0.5"]["vs_truncated"]
    assert d["x"] == "tail@0.5" and d["y"] == "truncated@0.5" and len(d["gap_diff_ci"]) == 2
    want = c["tail@0.5"]["gap_recovered"] - c["truncated@0.5"]["gap_recovered"]
    assert d["gap_diff"] == pytest.approx(want, abs=1e-9)
    assert c["transferred"]["vs_source"]["y"] == "source"
    assert out["verdict"]["text"]


def _d(gap, lo, hi):
    return {"gap_diff": gap, "gap_diff_ci": [lo, hi]}


def test_verdict_is_the_smallest_point_beating_both():
    diffs = {}
    for r, src, trunc in ((0.1, (0.05, -0.01, 0.1), (0.2, 0.1, 0.3)), (0.25, (0.1, 0.02, 0.2), (0.1, 0.01, 0.2))):
        diffs[f"{point_name('tail', r)}_vs_source"] = _d(*src)
        diffs[f"{point_name('tail', r)}_vs_{point_name('truncated', r)}"] = _d(*trunc)
    v = verdict(diffs, (0.25, 0.1))
    assert v["pays_from"] == 0.25 and v["text"].startswith("the transfer pays from R = 0.25")
    diffs["tail@0.25_vs_truncated@0.25"] = _d(0.1, -0.01, 0.2)
    v = verdict(diffs, (0.1, 0.25))
    assert v == {"pays_from": None, "text": "does not pay at any measured point (R = 0.1, 0.25)"}
    nan = math.nan
    diffs = {k: _d(0.1, nan, nan) for k in diffs}
    assert verdict(diffs, (0.1, 0.25))["text"].startswith("no verdict")
