"""The guarded hand-off: checks on live input, visible fallback to the target's own prefill."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch

from kvbridge.evaluate.guard import (
    GuardError,
    GuardFallbackWarning,
    GuardSettings,
    TargetStats,
    guarded_generate,
    guarded_prepare,
)


@pytest.fixture(scope="module")
def setup(base):
    from kvbridge.plugins import get_host
    from kvbridge.transfer import identity_transfer

    model = base[0]
    ad = get_host().adapter_for(model.config.to_dict())
    ids = torch.randint(1, 1000, (1, 24), generator=torch.Generator().manual_seed(4))
    state = identity_transfer(ad.extract(model, ids[:, :20]))
    stats = TargetStats.from_model(model, ids)
    return model, ad, ids, state, stats


def test_good_state_is_used_and_stays_marked(setup, noisy):
    model, ad, ids, state, stats = setup
    with warnings.catch_warnings():
        warnings.simplefilter("error", GuardFallbackWarning)
        h = guarded_prepare(model, state, ids, GuardSettings(kl_probe=True), stats=stats)
    assert h.used == "transferred" and not h.fell_back and not h.approximate  # identity of its own cache
    assert [c.name for c in h.checks] == ["finite", "geometry", "magnitude", "kl_probe"]
    assert h.checks[-1].value <= 1e-9
    from kvbridge.transfer import transfer

    mapped = transfer(ad.extract(model, ids[:, :20]), noisy(0.01), ad.spec_of(model))
    h2 = guarded_prepare(model, mapped, ids, stats=stats)
    assert h2.used == "transferred" and h2.approximate and h2.state.approximate


@pytest.mark.parametrize("breakage", ["nan", "huge", "kl"])
def test_bad_state_falls_back_visibly(setup, breakage, noisy):
    model, ad, ids, state, stats = setup
    if breakage == "nan":
        keys = list(state.keys)
        keys[1] = keys[1].clone()
        keys[1][0, 0, 3, 0] = float("nan")
        bad, kw, name = replace(state, keys=tuple(keys)), {}, "finite"
    elif breakage == "huge":
        bad, kw, name = state.map_tensors(lambda t: t * 50), {}, "magnitude"
    else:
        from kvbridge.transfer import transfer

        bad = transfer(ad.extract(model, ids[:, :20]), noisy(1.5), ad.spec_of(model))
        kw, name = {"kl_probe": True, "kl_max": 1e-3, "max_ratio": 100.0}, "kl_probe"
    seen = []
    with pytest.warns(GuardFallbackWarning, match="using the target's own prefill"):
        h = guarded_prepare(model, bad, ids, GuardSettings(**kw), stats=stats, on_fallback=seen.append)
    assert h.fell_back and h.used == "target_prefill" and not h.approximate
    assert any(name in r for r in h.reasons) and seen == [h]
    assert name in h.summary() and "fell back" in h.summary()
    with pytest.raises(GuardError, match="rejected"):
        guarded_prepare(model, bad, ids, GuardSettings(strict=True, **kw), stats=stats)


def test_fallback_generates_what_the_target_would(setup):
    model, ad, ids, state, stats = setup
    bad = state.map_tensors(lambda t: t * 0 + float("inf"))
    with pytest.warns(GuardFallbackWarning):
        out, h = guarded_generate(model, bad, ids, guard={"stats": stats}, max_new_tokens=6, do_sample=False)
    ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    assert h.fell_back and torch.equal(out, ref)


def test_stats_round_trip(setup):
    stats = setup[4]
    assert TargetStats.from_dict(stats.to_dict()) == stats and len(stats.k_rms) == 4
