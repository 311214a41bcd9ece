"""The evaluation machinery on known answers: identity is exact, controls are worse, a
perturbed mapping lies between, intervals contain their estimates, JSON keys are stable."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kvbridge.evaluate.conditions import CONDITIONS, CONTROLS

from .conftest import C, G, P

REQUIRED = ("nll", "kl_mean", "kl_p95", "top1_agreement", "gap_recovered", "attention_cosine_min")


def test_identity_transfer_is_native(identity_result):
    t = identity_result["conditions"]["transferred"]
    assert t["kl_mean"] <= 1e-9 and t["kl_p95"] <= 1e-9
    assert t["top1_agreement"] == 1.0 and t["topk_overlap"] == 1.0
    assert t["max_abs_logit_diff"] <= 1e-4
    assert t["gap_recovered"] == pytest.approx(1.0, abs=1e-4)
    assert t["attention_cosine_min"] >= 1 - 1e-6 and t["attention_cosine_mean"] >= 1 - 1e-6
    assert t["greedy_agreement"] == 1.0 and t["retention"] == pytest.approx(1.0)
    native = identity_result["conditions"]["native"]
    assert native["kl_mean"] == 0 and native["gap_recovered"] == 1.0 and native["attention_cosine_min"] == 1.0


def test_floor_and_controls_are_worse(identity_result):
    conds = identity_result["conditions"]
    native = conds["native"]
    assert conds["no_prefix"]["nll"] > native["nll"]
    assert conds["no_prefix"]["gap_recovered"] == pytest.approx(0.0, abs=1e-9)
    assert conds["no_prefix"]["attention_cosine_min"] is None  # no prefix K/V to compare
    for c in CONTROLS:
        row = conds[c]
        assert row["nll"] > native["nll"], c
        assert row["kl_mean"] > 0.02, c
        assert row["top1_agreement"] < 0.95, c
        assert row["attention_cosine_min"] < 0.99, c
        assert row["gap_recovered"] < 0.9, c
    # the source is the same model here: identical to native
    assert conds["source"]["kl_mean"] <= 1e-9


def test_retention_overstates(identity_result):
    """No prefix at all keeps most of the papers' retention but recovers none of the gap."""
    np_ = identity_result["conditions"]["no_prefix"]
    assert np_["retention"] > 0.7 and np_["gap_recovered"] == pytest.approx(0.0, abs=1e-9)


def test_perturbed_mapping_lies_between(base, samples, host, noisy):
    from kvbridge.evaluate import evaluate

    model = base[0]
    kw = dict(
        prefix_len=P,
        continuation_len=C,
        greedy_tokens=G,
        bootstrap=0,
        host=host,
        conditions=("native", "transferred", "no_prefix", "zeroed", "random"),
    )
    small = evaluate(model, model, noisy(0.05), samples, **kw)["conditions"]
    large = evaluate(model, model, noisy(0.5), samples, **kw)["conditions"]
    for res in (small, large):
        t = res["transferred"]
        assert 0 < t["kl_mean"] < res["random"]["kl_mean"]
        assert res["zeroed"]["attention_cosine_min"] < t["attention_cosine_min"] < 1.0
    assert small["transferred"]["kl_mean"] < large["transferred"]["kl_mean"]
    assert small["transferred"]["attention_cosine_min"] > large["transferred"]["attention_cosine_min"]
    assert small["native"]["nll"] < small["transferred"]["nll"] < small["no_prefix"]["nll"]
    assert 0.5 < small["transferred"]["gap_recovered"] < 1.0


def test_bootstrap_intervals_contain_estimates(identity_result):
    for cond, row in identity_result["conditions"].items():
        for m in ("nll", "kl_mean", "top1_agreement", "topk_overlap", "accuracy", "attention_cosine_mean"):
            v, ci = row[m], row[f"{m}_ci"]
            if v is None:
                assert ci == [None, None]
                continue
            assert ci[0] - 1e-9 <= v <= ci[1] + 1e-9, (cond, m, v, ci)
    lo, hi = identity_result["conditions"]["no_prefix"]["nll_ci"]
    assert hi - lo > 0  # real spread over samples
    comp = identity_result["comparisons"]["transferred_vs_random"]
    assert comp["nll_diff"] < 0 and comp["nll_diff_ci"][0] <= comp["nll_diff"] <= comp["nll_diff_ci"][1]


def test_bootstrap_is_paired_and_seeded(base, samples, host):
    from kvbridge.builtin.identity import IdentityMapping
    from kvbridge.evaluate.conditions import run_conditions
    from kvbridge.evaluate.settings import EvalSettings
    from kvbridge.evaluate.metrics import summarize

    run = run_conditions(
        base[0],
        base[0],
        IdentityMapping(),
        samples,
        EvalSettings(
            prefix_len=P, continuation_len=C, greedy_tokens=2, conditions=("native", "transferred", "no_prefix")
        ),
        host=host,
    )
    a = summarize(run, bootstrap=200, seed=3, host=host)
    b = summarize(run, bootstrap=200, seed=3, host=host)
    assert json.dumps(a) == json.dumps(b)  # (nan != nan, so compare the text)
    # paired: the transferred-vs-native difference is identically 0 in every replicate
    assert a["comparisons"]["transferred_vs_native"]["nll_diff_ci"] == pytest.approx([0.0, 0.0], abs=1e-6)


def test_json_keys_are_stable(identity_result):
    from kvbridge.evaluate.report import to_json

    text = to_json(identity_result)  # strict JSON: no NaN
    data = json.loads(text)
    for key in (
        "schema",
        "source",
        "target",
        "mapping",
        "data",
        "samples",
        "prefix_len",
        "continuation_len",
        "greedy_tokens",
        "bootstrap",
        "conditions",
        "comparisons",
        "gates",
        "gates_passed",
        "timing",
        "definitions",
        "notes",
    ):
        assert key in data, key
    assert data["schema"] == "kvbridge-eval/1"
    assert list(data["conditions"]) == list(CONDITIONS)
    for cond, row in data["conditions"].items():
        for m in REQUIRED + (
            "perplexity",
            "topk_overlap",
            "tv_top_p",
            "max_abs_logit_diff",
            "retention",
            "greedy_agreement",
            "attention_cosine_mean",
        ):
            assert m in row and f"{m}_ci" in row, (cond, m)
            assert isinstance(row[f"{m}_ci"], list) and len(row[f"{m}_ci"]) == 2
    assert len(data["conditions"]["transferred"]["attention_cosine_layers"]) == 4
    assert data["samples"] == 12 and data["prefix_len"] == P and data["continuation_len"] == C


def test_position_fields_known_values():
    from kvbridge.evaluate.conditions import position_fields

    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]])
    targets = torch.tensor([[1]])
    fields, native = position_fields(logits, targets, None, top_k=2, top_p=0.9)
    assert float(fields["nll"]) == pytest.approx(-float(torch.log_softmax(logits, -1)[0, 0, 1]))
    same, _ = position_fields(logits.clone(), targets, native, top_k=2, top_p=0.9)
    assert float(same["kl"]) == 0 and float(same["tv"]) == 0 and float(same["top1"]) == 1
    flipped, _ = position_fields(logits.flip(-1), targets, native, top_k=2, top_p=0.9)
    assert float(flipped["top1"]) == 0 and float(flipped["topk"]) == 0 and float(flipped["kl"]) > 1
    assert 0 < float(flipped["tv"]) < 1  # top-p 0.9 keeps 3 of 4 tokens: the nuclei overlap
    _, nat = position_fields(logits, targets, None, top_k=2, top_p=0.5)
    one, _ = position_fields(logits.flip(-1), targets, nat, top_k=2, top_p=0.5)
    assert float(one["tv"]) == pytest.approx(1.0)  # top-p 0.5 keeps the argmax only: disjoint
    assert float(flipped["max_abs_logit_diff"]) == pytest.approx(3.0)


def test_attention_output_matches_the_model(base):
    """Recomputed attention from captured tensors equals what the model computed."""
    from kvbridge.evaluate.conditions import attention_output, capture_attention
    from kvbridge.plugins import get_host

    model = base[0]
    ids = torch.randint(0, 1000, (2, 20), generator=torch.Generator().manual_seed(0))
    ad = get_host().adapter_for(model.config.to_dict())
    state = ad.extract(model, ids[:, :12])
    outs = {}
    hook = model.model.layers[1].self_attn.o_proj.register_forward_hook(
        lambda mod, inp, out: outs.setdefault("in", inp[0].detach())
    )
    try:
        with capture_attention(model) as cap:
            with torch.no_grad():
                model(input_ids=ids[:, 12:], cache=ad.inject(state, model), use_cache=True)
    finally:
        hook.remove()
    assert model.config._attn_implementation != "kvbridge_capture"  # restored
    c = cap[1]
    got = attention_output(c["q"], c["k"], c["v"], c["mask"], scaling=c["scaling"])
    b, h, t, d = got.shape
    assert torch.allclose(got.transpose(1, 2).reshape(b, t, h * d), outs["in"], atol=1e-5)
    assert c["k"].shape[2] == 20 and c["q"].shape[2] == 8


def test_too_few_tokens_is_one_line_error(base, host):
    from kvbridge.builtin.identity import IdentityMapping
    from kvbridge.evaluate import evaluate
    from kvbridge.evaluate.conditions import EvalError

    with pytest.raises(EvalError, match="samples must be"):
        evaluate(
            base[0],
            base[0],
            IdentityMapping(),
            torch.zeros(4, 10, dtype=torch.long),
            prefix_len=8,
            continuation_len=4,
            host=host,
        )


def test_windows_and_heldout_text():
    from kvbridge.evaluate import heldout_text, windows

    text = "".join(f"line {i}\n" for i in range(100))
    tail = heldout_text(text, 0.1)
    assert tail.startswith("line ") and len(tail) < len(text) * 0.12 and text.endswith(tail)
    w = windows(torch.arange(100), 4, 10)
    assert w.shape == (4, 10) and int(w[0, 0]) == 0 and int(w[-1, -1]) == 99
    assert math.isclose(float(w[1, 0]), 30, abs_tol=1)
