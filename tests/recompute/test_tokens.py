"""Both ends of the token dial, on a graft and on a transferred prefix."""

from __future__ import annotations

import pytest
import torch

from kvbridge.recompute.graft import graft, prepare_chunk
from kvbridge.recompute.tokens import blend, count_for, parse_ratio
from kvbridge.recompute.layers import RecomputeError

from .conftest import adapter, cont_logits


def _ids(model, n, t, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (n, t), generator=g)


def test_ratio_parsing_and_counts():
    assert parse_ratio("15%") == pytest.approx(0.15) and parse_ratio("0.5") == 0.5
    assert count_for(0.15, 40) == 6 and count_for(0.0, 40) == 0 and count_for(1.0, 40) == 40
    assert count_for(0.001, 40) == 1
    for bad in ("x", "150%", "-1"):
        with pytest.raises(RecomputeError):
            parse_ratio(bad)


@pytest.mark.parametrize("which", ["tiny", "zoo_base"])
def test_graft_ends_of_the_dial(which, request):
    model = request.getfixturevalue(which)
    ad = adapter(model)
    ctx, chk, cont = _ids(model, 2, 12, 1), _ids(model, 2, 20, 2), _ids(model, 2, 5, 3)
    full = ad.extract(model, torch.cat([ctx, chk], 1))
    naive = graft(ad.extract(model, ctx), prepare_chunk(model, chk))
    assert torch.equal(naive.positions, full.positions)
    ref = cont_logits(model, full, cont)
    # 0%: the naive graft, bitwise
    zero = blend(model, naive, 12, 0.0)
    assert torch.equal(cont_logits(model, zero.state, cont), cont_logits(model, naive, cont))
    # 100%: the full prefill of context + chunk
    every = blend(model, naive, 12, 1.0)
    assert (cont_logits(model, every.state, cont) - ref).abs().max().item() <= 1e-5
    assert (cont_logits(model, naive, cont) - ref).abs().max().item() > 1e-4  # the graft is not exact: test can fail
    # layer 0's K/V of the graft equal the full prefill's (they do not depend on other tokens)
    assert torch.allclose(naive.keys[0], full.keys[0], atol=1e-5)


def test_partial_recompute_moves_towards_the_full_prefill(zoo_base):
    model = zoo_base
    ad = adapter(model)
    ctx, chk, _cont = _ids(model, 4, 24, 4), _ids(model, 4, 40, 5), _ids(model, 4, 6, 6)
    full = ad.extract(model, torch.cat([ctx, chk], 1))
    naive = graft(ad.extract(model, ctx), prepare_chunk(model, chk))
    res = blend(model, naive, 24, 0.25)
    assert res.selected.shape == (4, 10) and res.deviation.shape == (4, 40)
    # the picked rows are the most deviating ones
    top = res.deviation.topk(10, dim=1).indices.sort(dim=1).values
    assert torch.equal(top, res.selected)
    # unpicked rows keep the graft's K/V beyond the check layer
    last = model.config.num_hidden_layers - 1
    b = 0
    others = [i for i in range(40) if i not in set(res.selected[b].tolist())]
    assert torch.equal(
        res.state.keys[last][b][:, [24 + i for i in others]], naive.keys[last][b][:, [24 + i for i in others]]
    )
    err = lambda s: sum((a[:, :, 24:] - f[:, :, 24:]).pow(2).sum() for a, f in zip(s.keys, full.keys))
    assert err(res.state) < err(naive)
    assert 0 < res.cost.flop_share < 1


@pytest.mark.parametrize("which", ["tiny", "zoo_base"])
def test_transferred_prefix_ends_of_the_dial(which, request, zoo_stranger):
    """Cross-model: exact_len 0 over a mapped cache; 100% is the target's prefill."""
    from kvbridge.transfer import identity_transfer

    target = request.getfixturevalue(which)
    source = zoo_stranger if which == "zoo_base" else target
    ids, cont = _ids(target, 2, 24, 7), _ids(target, 2, 5, 8)
    mapped = identity_transfer(adapter(source).extract(source, ids))
    if which == "tiny":
        mapped = mapped.map_tensors(lambda t: t * 0.5)
    native = adapter(target).extract(target, ids)
    assert torch.equal(
        cont_logits(target, blend(target, mapped, 0, 0.0).state, cont), cont_logits(target, mapped, cont)
    )
    every = blend(target, mapped, 0, 1.0)
    assert (cont_logits(target, every.state, cont) - cont_logits(target, native, cont)).abs().max().item() <= 1e-5


def test_first_rule_picks_the_chunk_start(tiny):
    ad = adapter(tiny)
    ctx, chk = _ids(tiny, 2, 6, 9), _ids(tiny, 2, 10, 10)
    naive = graft(ad.extract(tiny, ctx), prepare_chunk(tiny, chk))
    res = blend(tiny, naive, 6, 0.3, rule="first")
    assert res.selected.tolist() == [[0, 1, 2], [0, 1, 2]]
    with pytest.raises(RecomputeError):
        blend(tiny, naive, 6, 0.3, rule="nope")


def test_recomputed_leading_rows_are_exact(zoo_base):
    """With the first k rows recomputed, they attend only to exact rows: their K/V equal the full prefill's."""
    model = zoo_base
    ad = adapter(model)
    ctx, chk = _ids(model, 2, 10, 11), _ids(model, 2, 20, 12)
    full = ad.extract(model, torch.cat([ctx, chk], 1))
    naive = graft(ad.extract(model, ctx), prepare_chunk(model, chk))
    res = blend(model, naive, 10, 0.4, rule="first")
    for got, want, old in zip(res.state.keys, full.keys, naive.keys):
        assert torch.allclose(got[:, :, :18], want[:, :, :18], atol=1e-5)
    last = model.config.num_hidden_layers - 1
    assert not torch.allclose(res.state.keys[last][:, :, 18:], full.keys[last][:, :, 18:], atol=1e-3)


def test_last_rule_picks_the_tail_and_leaves_the_rest(zoo_base):
    """``rule="last"``: the stretch's last k rows are recomputed beyond the check layer, the others keep
    the approximate K/V there; layers up to the check layer are the target's own for every row."""
    model = zoo_base
    ad = adapter(model)
    ctx, chk = _ids(model, 2, 8, 21), _ids(model, 2, 10, 22)
    naive = graft(ad.extract(model, ctx), prepare_chunk(model, chk))
    res = blend(model, naive, 8, 0.3, rule="last")
    assert res.selected.tolist() == [[7, 8, 9], [7, 8, 9]]
    assert res.state.meta["token_rule"] == "last"
    last = model.config.num_hidden_layers - 1
    assert torch.equal(res.state.keys[last][:, :, :15], naive.keys[last][:, :, :15])  # context + unpicked rows
    assert not torch.allclose(res.state.keys[last][:, :, 15:], naive.keys[last][:, :, 15:], atol=1e-4)
    same_cost = blend(model, naive, 8, 0.3, rule="deviation")
    assert res.cost.rows_per_layer == same_cost.cost.rows_per_layer  # one budget of rows, another choice
    assert res.cost.flops >= same_cost.cost.flops  # the tail rows attend to the most keys


def test_curve_names_a_point_per_rule(zoo_base, zoo_stranger):
    """``run_curve(token_rules=...)``: ``tokens@R`` (deviation) and ``last@R`` on the same samples, same cost."""
    from kvbridge.builtin.identity import IdentityFitter
    from kvbridge.evaluate.settings import EvalSettings
    from kvbridge.recompute.curve import run_curve
    from kvbridge.recompute.settings import CurvePlan
    from kvbridge.run import model_run

    sspec, tspec = adapter(zoo_stranger).spec_of(zoo_stranger), adapter(zoo_base).spec_of(zoo_base)
    mapping = IdentityFitter().fit(sspec, tspec)
    ids = _ids(zoo_base, 4, 16 + 4 + 1, 31)
    settings = EvalSettings(
        mapping="identity", corpus="-", prefix_len=16, continuation_len=4, attention=False, bootstrap=20, batch_size=4
    )
    run = model_run(zoo_stranger, zoo_base, settings)
    out = run_curve(run, mapping, ids, CurvePlan(token_ratios=(0.25, 1.0), token_rules=("deviation", "last")))
    c = out["conditions"]
    assert {"tokens@0.25", "last@0.25", "tokens@1", "last@1"} <= set(c)
    assert c["last@0.25"]["share"] == 0.25
    assert (
        c["tokens@0.25"]["recompute_flop_share"]
        <= c["last@0.25"]["recompute_flop_share"]
        < c["last@1"]["recompute_flop_share"]
    )
    assert c["last@1"]["kl_p95"] < 1e-9  # every row at every layer: the target's own prefill
    with pytest.raises(RecomputeError):
        run_curve(run, mapping, ids, CurvePlan(token_ratios=(0.25,), token_rules=("nope",)))
