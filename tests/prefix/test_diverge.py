"""Divergence analysis: one sampler for every path, pairwise first-divergence metrics, honest summaries."""

from __future__ import annotations

import json

import pytest
import torch

from kvbridge.prefix.diverge import (
    MIN_SEEDS_FOR_RATE,
    Sampler,
    Trajectory,
    compare_trajectories,
    diverge,
    summarise,
    wilson_interval,
)
from kvbridge.errors import KVBridgeError


@pytest.fixture(scope="module")
def env(tiny_llama):
    return tiny_llama.model(), tiny_llama.tok


# -- statistics and the sampler -------------------------------------------------------------------
def test_wilson_interval_known_values():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(4, 4) == pytest.approx((0.5101, 1.0), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([0.2, 0.5, 0.3]))
    assert Sampler(1.0, 0.7).probs(logits).tolist() == pytest.approx([0.0, 0.625, 0.375])
    assert Sampler(1.0, 0.5).probs(logits).tolist() == pytest.approx([0.0, 1.0, 0.0])
    assert Sampler(1.0, 1.0).probs(logits).tolist() == pytest.approx([0.2, 0.5, 0.3])
    hot = Sampler(0.5, 1.0).probs(logits)
    assert float(hot[1]) > 0.5 and float(hot.sum()) == pytest.approx(1.0)


def test_same_seed_same_distribution_same_tokens_and_one_uniform_per_step():
    s = Sampler(0.9, 0.9)
    rows = torch.randn(50, 40, generator=torch.Generator().manual_seed(1))
    draw = lambda seed: [s.draw(r, g) for g in [torch.Generator().manual_seed(seed)] for r in rows]  # noqa: E731
    assert draw(3) == draw(3) and draw(3) != draw(4)
    # never a token outside the nucleus
    for r, t in zip(rows, draw(5)):
        assert float(s.probs(r)[t]) > 0
    # the generator advances by exactly one uniform per step, whatever the distribution
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    s.draw(rows[0], g1)
    torch.rand((), generator=g2, dtype=torch.float64)
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))


def test_sampler_frequencies_follow_the_distribution():
    s = Sampler(1.0, 1.0)
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([s.draw(logits, g) for _ in range(4000)]), minlength=3).double() / 4000
    assert counts.tolist() == pytest.approx([0.5, 0.3, 0.2], abs=0.03)


def test_sampler_refuses_bad_settings():
    with pytest.raises(KVBridgeError, match="temperature"):
        Sampler(0.0, 1.0)
    with pytest.raises(KVBridgeError, match="top-p"):
        Sampler(1.0, 1.5)


def test_compare_trajectories_reports_the_first_divergence():
    V = 40
    base = torch.randn(5, V, generator=torch.Generator().manual_seed(0))
    other = base.clone()
    other[2] += 0.01 * torch.randn(V, generator=torch.Generator().manual_seed(1))
    a = Trajectory("a", [1, 2, 3, 4, 5], base)
    b = Trajectory("b", [1, 2, 9, 4, 5], other)
    s = Sampler(1.0, 0.9)
    res = compare_trajectories(a, b, s)
    d = res["at_divergence"]
    assert not res["identical"] and res["first_divergence"] == 2 and d["step"] == 2
    assert (d["token_a"], d["token_b"]) == (3, 9)
    assert d["argmax_agree"] == (int(base[2].argmax()) == int(other[2].argmax()))
    assert 20 <= d["top25_overlap"] <= 25
    assert d["max_abs_logit_diff"] == pytest.approx(float((base[2] - other[2]).abs().max()))
    want_tv = 0.5 * float((s.probs(base[2]) - s.probs(other[2])).abs().sum())
    assert d["tv_post_top_p"] == pytest.approx(want_tv)
    same = compare_trajectories(a, Trajectory("c", list(a.tokens), base.clone()), s)
    assert same["identical"] and same["bitwise_equal_logits"] and "at_divergence" not in same


def test_summary_says_when_there_are_too_few_seeds():
    one = {"identical": True, "bitwise_equal_logits": False, "max_abs_logit_diff_shared_steps": 1e-7}
    few = summarise([dict(one) for _ in range(4)])
    assert few["identical"] == 4 and few["rate_note"].startswith("too few seeds (n=4) to estimate a rate")
    assert few["identical_rate_wilson95"] == pytest.approx([0.5101, 1.0], abs=1e-4)
    many = summarise([dict(one) for _ in range(MIN_SEEDS_FOR_RATE)])
    assert "too few" not in many["rate_note"] and "Wilson" in many["rate_note"]


# -- the four paths on a tiny model ---------------------------------------------------------------
def test_diverge_paths_on_a_tiny_model(env, tiny_guide, tiny_prompt):
    model, tok = env
    rep = diverge(model, tok, tiny_guide, tiny_prompt, seeds=3, max_new_tokens=6, top_p=0.9)
    d = rep.to_dict()
    json.dumps(d)
    assert d["split"]["kind"] == "safe" and d["split"]["matches_joint"]
    assert set(d["pairs"]) == {
        "full-vs-cached",
        "full-vs-split",
        "full-vs-concat",
        "cached-vs-split",
        "cached-vs-concat",
        "split-vs-concat",
    }
    assert set(d["greedy"]) == set(d["pairs"])
    # with the exact split, concat is the joint sequence: the very same computation as cached
    cc = d["pairs"]["cached-vs-concat"]
    assert all(r["identical"] and r["bitwise_equal_logits"] for r in cc["seeds"])
    assert cc["summary"]["identical"] == 3 and "too few seeds" in cc["summary"]["rate_note"]
    # the other paths differ only by floating-point execution order here
    for name, data in d["pairs"].items():
        for r in data["seeds"]:
            assert r["max_abs_logit_diff_shared_steps"] < 1e-4, name
    assert any("too few" in n for n in d["notes"]) and any("prefix pack" in n for n in d["notes"])
    assert set(d["tokens"]) == {"0", "1", "2", "greedy"}
    assert all(len(t) == 6 for t in d["tokens"]["0"].values())
    assert rep.lines()[0].startswith("split: safe")


def test_naive_split_separates_the_token_sequence_effect(env, tiny_guide):
    model, tok = env
    from kvbridge.prefix.splits import split_text

    prompt = "zorp is blue?"
    assert not split_text(tok, tiny_guide, prompt).naive.matches_joint  # "Ġzorp" vs "Ġ" + "zorp"
    rep = diverge(model, tok, tiny_guide, prompt, seeds=2, max_new_tokens=4, split="naive")
    assert rep.split["kind"] == "naive" and not rep.split["matches_joint"]
    assert rep.split["ghost_len"] + rep.split["live_len"] > rep.split["joint_len"]
    assert any("token-sequence" in n for n in rep.notes)
    # cached (joint ids) vs concat (naive ids) see different tokens; concat vs split only differ in execution
    g = rep.greedy
    assert not g["cached-vs-concat"]["bitwise_equal_logits"]
    assert g["split-vs-concat"]["max_abs_logit_diff_shared_steps"] < 1e-4


def test_greedy_only_and_subset_of_paths(env, tiny_guide, tiny_prompt):
    model, tok = env
    rep = diverge(model, tok, tiny_guide, tiny_prompt, greedy_only=True, max_new_tokens=3, paths=("cached", "split"))
    assert rep.seeds == () and rep.pairs == {} and set(rep.greedy) == {"cached-vs-split"}


def test_bad_inputs(env, tiny_guide, tiny_prompt):
    model, tok = env
    with pytest.raises(KVBridgeError, match="exceed the model's 96 positions"):
        diverge(model, tok, tiny_guide, tiny_prompt, seeds=1, max_new_tokens=80)
    with pytest.raises(KVBridgeError, match="paths must be"):
        diverge(model, tok, tiny_guide, tiny_prompt, paths=("cached", "bogus"))
    with pytest.raises(KVBridgeError, match="guide is empty"):
        diverge(model, tok, "", tiny_prompt)


def test_a_pack_of_another_guide_is_refused(env, tmp_path, tiny_guide, tiny_prompt):
    model, tok = env
    from kvbridge.prefix.packs import load_pack, save_pack

    out = save_pack(model, tmp_path / "p", guide_text="Something else entirely.", tokenizer=tok)
    with pytest.raises(KVBridgeError, match="is not the ghost"):
        diverge(model, tok, tiny_guide, tiny_prompt, seeds=1, max_new_tokens=2, pack=load_pack(out, model))


def test_a_run_beyond_the_model_positions_is_refused_before_any_path_runs(env, tiny_guide, tiny_prompt):
    model, tok = env  # 96 positions
    with pytest.raises(KVBridgeError, match=r"new tokens = \d+ tokens exceed the model's 96 positions"):
        diverge(model, tok, tiny_guide, tiny_prompt, seeds=1, max_new_tokens=90)
