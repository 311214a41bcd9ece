"""Grafting: exact re-positioning, the conditions on shared samples, packs grafted directly."""

from __future__ import annotations

import pytest
import torch

from kvbridge.recompute.graft import concat_states, graft, prepare_chunk, run_graft
from kvbridge.recompute.settings import GraftSettings

from .conftest import adapter, cont_logits


def _ids(model, n, t, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (n, t), generator=g)


def test_graft_of_a_prefix_chunk_at_zero_is_the_chunk_itself(tiny):
    """With no context the graft is the chunk's own prefill: a prefix keeps causal semantics."""
    chk, cont = _ids(tiny, 2, 10, 1), _ids(tiny, 2, 4, 2)
    alone = prepare_chunk(tiny, chk)
    empty = alone.slice_tokens(0, 0)
    got = graft(empty, alone)
    assert torch.equal(cont_logits(tiny, got, cont), cont_logits(tiny, alone, cont))


def test_reposition_matches_the_keys_rotated_at_the_new_positions(zoo_base):
    """Layer 0's keys depend on the token alone: after re-positioning they equal the full prefill's."""
    ad = adapter(zoo_base)
    ctx, chk = _ids(zoo_base, 1, 7, 3), _ids(zoo_base, 1, 9, 4)
    full = ad.extract(zoo_base, torch.cat([ctx, chk], 1))
    moved = graft(ad.extract(zoo_base, ctx), prepare_chunk(zoo_base, chk))
    assert torch.allclose(moved.keys[0], full.keys[0], atol=1e-5)
    wrong = graft(ad.extract(zoo_base, ctx), prepare_chunk(zoo_base, chk), reposition=False)
    assert not torch.allclose(wrong.keys[0][:, :, 7:], full.keys[0][:, :, 7:], atol=1e-3)
    assert moved.approximate and concat_states(moved, moved.slice_tokens(0, 0)).num_tokens == 16


def test_run_graft_conditions(zoo_base):
    from kvbridge.evaluate import model_samples

    ids = model_samples(zoo_base, n=4, length=47, seed=1)  # text the model predicts: the chunk matters
    ctx, chk, cont = ids[:, :16], ids[:, 16:40], ids[:, 40:]
    r = run_graft(zoo_base, (ctx, chk, cont), GraftSettings(ratios=(0.25, 1.0), bootstrap=50, batch_size=2))
    c = r["conditions"]
    assert list(c) == ["full", "naive", "blend@0.25", "blend@1", "random@0.25", "no_reposition", "shuffled", "dropped"]
    assert c["blend@1"]["kl_p95"] < 1e-9 and c["blend@1"]["gap_recovered"] == pytest.approx(1.0, abs=1e-6)
    assert c["dropped"]["gap_recovered"] == 0.0 and c["naive"]["deficit_closed"] == 0.0
    assert c["naive"]["kl_p95"] > 0
    assert 0 < c["blend@0.25"]["recompute_flop_share"] < c["blend@1"]["recompute_flop_share"] <= 1
    assert c["random@0.25"]["recompute_flop_share"] == pytest.approx(c["blend@0.25"]["recompute_flop_share"], rel=0.05)
    lo, hi = c["naive"]["gap_recovered_ci"]
    assert lo <= c["naive"]["gap_recovered"] <= hi


def test_a_pack_is_grafted_directly(tiny, tmp_path):
    from kvbridge.prefix.packs import load_pack, save_pack

    chk = _ids(tiny, 1, 9, 8)
    save_pack(tiny, tmp_path / "p", guide_ids=chk[0].tolist(), tokenizer_fp={"fingerprint": None})
    pack = load_pack(tmp_path / "p", tiny, tokenizer_fp={"fingerprint": None}, check_weights=False)
    ad = adapter(tiny)
    ctx = _ids(tiny, 1, 5, 9)
    from_pack = graft(ad.extract(tiny, ctx), pack.state)
    from_prefill = graft(ad.extract(tiny, ctx), prepare_chunk(tiny, chk))
    for a, b in zip(from_pack.keys, from_prefill.keys):
        assert torch.equal(a, b)
