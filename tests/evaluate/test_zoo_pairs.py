"""What must hold on the trained zoo: planted pairs recover the gap, base->tuned transfers
well and beats every control, base->stranger's cache cannot be reused as is.

Text: the front (calibration) and held-out tail (evaluation) of ../shared's corpus when it is
there. Without it, calibration text is sampled from the zoo models with fixed seeds (as
``kvbridge demo`` does) and evaluation text from the *target* only: text sampled from the
source favours the source's own cache (measured: on base-sampled text the base->tuned
transferred cache beat tuned's native one by 0.01 nats, significantly), which would turn the
"between native and no prefix" claim into a statement about the sampler.
"""

from __future__ import annotations

import pytest

from kvbridge.evaluate.conditions import CONTROLS

P, C, N, TOKENS = 64, 8, 48, 16384


@pytest.fixture(scope="module")
def zoo(base):
    from kvbridge.demo.zoo import calibration_ids, eval_ids, find_corpus

    from .conftest import _zoo_or_skip

    models = {"base": base[0], "tuned": _zoo_or_skip("tuned")[0], "stranger": _zoo_or_skip("stranger")[0]}
    corpus = find_corpus(None)
    calib = calibration_ids(corpus, base[1], models, TOKENS)
    evals = {name: eval_ids(corpus, base[1], {name: model}, N, P + C + 1) for name, model in models.items()}
    return {"models": models, "calib": calib, "evals": evals}


def _fit(zoo, target, host, top_k=4, stride=4):
    from kvbridge.fit import fit

    return fit(zoo["models"]["base"], target, zoo["calib"], top_k=top_k, stride=stride, host=host, distributed=None)


def _eval(zoo, name, mapping, host, target=None, **kw):
    from kvbridge.evaluate import evaluate

    ids, data = zoo["evals"][name]
    return evaluate(
        zoo["models"]["base"],
        target if target is not None else zoo["models"][name],
        mapping,
        ids,
        prefix_len=P,
        continuation_len=C,
        greedy_tokens=8,
        bootstrap=300,
        host=host,
        data=data,
        **kw,
    )


@pytest.fixture(scope="module")
def tuned_result(zoo, host):
    return _eval(zoo, "tuned", _fit(zoo, zoo["models"]["tuned"], host), host)


def test_base_to_tuned_between_native_and_floor_and_beats_every_control(tuned_result):
    c, comp = tuned_result["conditions"], tuned_result["comparisons"]
    t = c["transferred"]["nll"]
    assert t < c["no_prefix"]["nll"] and comp["transferred_vs_no_prefix"]["nll_diff_ci"][1] < 0
    # not better than native beyond noise (on a few hundred tokens it can come out a hair below)
    assert t >= c["native"]["nll"] or comp["transferred_vs_native"]["nll_diff_ci"][1] >= 0, comp[
        "transferred_vs_native"
    ]
    for ctrl in CONTROLS:
        assert t < c[ctrl]["nll"], ctrl
        ci = tuned_result["comparisons"][f"transferred_vs_{ctrl}"]["nll_diff_ci"]
        assert ci[1] < 0, (ctrl, ci)  # better on the paired bootstrap, not just on average
    assert c["transferred"]["gap_recovered"] > 0.8
    assert tuned_result["gates_passed"]


def test_base_to_stranger_cache_is_not_reusable_as_is(zoo, host, tuned_result):
    """The check allows identity by geometry; measured, the unfitted cache fails the default gates.

    A fitted ridge mapping base->stranger does far better on these tiny models (it passed the
    default gates when measured: see RESULTS.md), but stays measurably worse than base->tuned.
    """
    from kvbridge.builtin.identity import IdentityMapping

    target = zoo["models"]["stranger"]
    raw = _eval(zoo, "stranger", IdentityMapping(), host)
    assert not raw["gates_passed"]
    assert {g["metric"] for g in raw["gates"] if not g["passed"]} == {"kl_p95", "attention_cosine_min"}
    assert raw["conditions"]["transferred"]["gap_recovered"] < 0  # worse than no prefix at all
    fitted = _eval(zoo, "stranger", _fit(zoo, target, host), host)
    f, t = fitted["conditions"]["transferred"], tuned_result["conditions"]["transferred"]
    assert f["kl_p95"] > t["kl_p95"] and f["attention_cosine_min"] < t["attention_cosine_min"]
    assert f["kl_p95"] < raw["conditions"]["transferred"]["kl_p95"]


def test_planted_pair_recovers_the_gap(zoo, host, planted):
    """A reparametrised copy of base (known linear K/V map): the fit recovers >= 0.99 of the gap."""
    mapping = _fit(zoo, planted, host, top_k=1, stride=2)
    assert mapping.layer_selection() == [[0], [1], [2], [3]]
    res = _eval(
        zoo,
        "base",
        mapping,
        host,
        target=planted,
        conditions=("native", "transferred", "no_prefix", "zeroed", "source"),
    )
    t = res["conditions"]["transferred"]
    assert t["gap_recovered"] >= 0.99
    assert t["kl_p95"] <= 1e-3 and t["attention_cosine_min"] >= 0.999 and t["top1_agreement"] >= 0.99
    # the planted target computes base's function exactly: its native NLL is base's own
    assert res["conditions"]["source"]["nll"] == pytest.approx(res["conditions"]["native"]["nll"], abs=1e-4)
    assert res["conditions"]["zeroed"]["gap_recovered"] < 0.5
