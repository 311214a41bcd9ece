"""Both ends of the layer dial, selection parsing, the profiling pass and the cost record."""

from __future__ import annotations

import pytest
import torch

from kvbridge.recompute.layers import (
    RecomputeError,
    budget_count,
    capture_hidden,
    choose_layers,
    groups_of,
    parse_layers,
    recompute_layers,
)
from kvbridge.transfer import identity_transfer

from .conftest import adapter, cont_logits


def test_parse_layers():
    assert parse_layers("3,7-9", 12) == (3, 7, 8, 9)
    assert parse_layers("all", 3) == (0, 1, 2)
    assert parse_layers("none", 3) == () == parse_layers("", 3)
    assert parse_layers("auto:15%", 30) == ("auto", 0.15)
    assert parse_layers("auto:3", 30) == ("auto", 0.1)
    assert budget_count(0.15, 30) == 4 and budget_count(0.15, 4) == 0
    assert groups_of((0, 1, 3, 5, 6)) == [(0, 1), (3, 3), (5, 6)]
    for bad in ("3-1", "x", "12", "auto:150%", "auto:x"):
        with pytest.raises(RecomputeError):
            parse_layers(bad, 12)


def _setup(model, n=2, t=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (n, t), generator=g)
    cont = torch.randint(3, vocab, (n, 5), generator=g)
    return ids, cont


@pytest.mark.parametrize("which", ["tiny", "zoo_base"])
def test_zero_recompute_is_the_plain_path_bitwise(which, request):
    model = request.getfixturevalue(which)
    ids, cont = _setup(model)
    plain = identity_transfer(adapter(model).extract(model, ids))
    out, cost = recompute_layers(model, plain, ())
    assert torch.equal(cont_logits(model, out, cont), cont_logits(model, plain, cont))
    assert cost.flops == 0 and cost.flop_share == 0


@pytest.mark.parametrize("which", ["tiny", "zoo_base"])
@pytest.mark.parametrize("mode", ["target", "source"])
def test_full_recompute_is_the_target_prefill(which, mode, request):
    """A garbage (zeroed) cache with every layer recomputed gives the target's own prefill's logits."""
    model = request.getfixturevalue(which)
    ids, cont = _setup(model)
    ad = adapter(model)
    native, hidden = capture_hidden(model, lambda: ad.extract(model, ids))
    garbage = native.map_tensors(torch.zeros_like)
    out, cost = recompute_layers(
        model, garbage, "all" and range(model.config.num_hidden_layers), mode=mode, source_hidden=hidden
    )
    ref, got = cont_logits(model, native, cont), cont_logits(model, out, cont)
    assert (got - ref).abs().max().item() <= 1e-5
    assert not torch.equal(cont_logits(model, garbage, cont), ref)  # the test can fail
    assert cost.flop_share == pytest.approx(1.0)


def test_target_mode_stops_early_and_keeps_the_other_layers(zoo_base):
    model = zoo_base
    ids, _ = _setup(model)
    ad = adapter(model)
    native = ad.extract(model, ids)
    garbage = native.map_tensors(lambda t: t + 1.0)
    calls = []
    h = model.model.layers[3].register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        out, cost = recompute_layers(model, garbage, (1,))
    finally:
        h.remove()
    assert not calls  # stopped after layer 1: layer 3 never ran
    assert torch.equal(out.keys[1], native.keys[1]) and torch.equal(out.values[1], native.values[1])
    assert torch.equal(out.keys[0], garbage.keys[0]) and torch.equal(out.keys[3], garbage.keys[3])
    assert cost.layers_run == (0, 1) and cost.flop_share == pytest.approx(0.5)


def test_source_mode_costs_only_the_recomputed_layers(zoo_base):
    model = zoo_base
    ids, _ = _setup(model)
    ad = adapter(model)
    native, hidden = capture_hidden(model, lambda: ad.extract(model, ids))
    garbage = native.map_tensors(torch.zeros_like)
    out, cost = recompute_layers(model, garbage, (3,), mode="source", source_hidden=hidden)
    assert cost.layers_run == (3,) and cost.flop_share == pytest.approx(0.25)
    assert torch.allclose(out.keys[3], native.keys[3], atol=1e-5) and torch.equal(out.keys[2], garbage.keys[2])
    with pytest.raises(RecomputeError):
        recompute_layers(model, garbage, (3,), mode="source")


def test_greedy_and_profile_pick_the_broken_layer(zoo_base):
    """Only layer 2 of the 'mapping' is broken: both selections must find it first."""
    from dataclasses import replace

    from kvbridge.recompute.layers import Calibration, _logp, profile_layers

    model = zoo_base
    ad = adapter(model)
    ids, cont = _setup(model, n=4, t=32, seed=3)
    native = ad.extract(model, ids)
    broken = replace(
        native,
        keys=tuple(torch.zeros_like(k) if i == 2 else k for i, k in enumerate(native.keys)),
        values=tuple(torch.zeros_like(v) if i == 2 else v for i, v in enumerate(native.values)),
    )
    calib = Calibration((native,), (broken,), (cont,), (_logp(model, ad, native, cont),))
    ranks = profile_layers(model, calib)
    assert max(range(4), key=lambda i: ranks[i]) == 2
    assert ranks[0] == ranks[1] == ranks[3] == pytest.approx(0.0, abs=1e-9)
    layers, info = choose_layers("auto:1", model, calib)
    assert layers == (2,) and info["greedy_steps"][-1]["loss"] == pytest.approx(0.0, abs=1e-9)
    assert choose_layers("auto:25%", model, calib, method="profile")[0] == (2,)
    with pytest.raises(RecomputeError):
        choose_layers("auto:25%", model, None)


def test_prefix_selection_needs_no_calibration(zoo_base):
    assert choose_layers("auto:50%", zoo_base, None, method="prefix")[0] == (0, 1)
    assert choose_layers("1,3", zoo_base, None)[0] == (1, 3)
