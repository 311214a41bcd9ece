"""steer eval: the statistics, the arms (zero coefficients are bitwise the unsteered arm), the sweep PNG."""

from __future__ import annotations

import math

import pytest

from kvbridge.errors import KVBridgeError
from kvbridge.steer.evaluate import evaluate, lines, mcnemar_p, paired, plot_sweep, rate
from kvbridge.steer.scorers import positive_sentiment
from kvbridge.steer.settings import SteerEvalSettings


def _settings(**fields) -> SteerEvalSettings:
    """``steer eval``'s settings on the zoo prompt (the vector and the scorer are passed loaded)."""
    return SteerEvalSettings(
        **{"vector": "zoo-vector", "prompt": "ROMEO: I will", "scorer": "positive_sentiment", **fields}
    )


def test_mcnemar_and_paired_difference():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(5, 0) == pytest.approx(2 / 32)
    assert mcnemar_p(3, 3) == 1.0
    p = paired([True, True, False, True], [False, True, False, False], bootstrap=500)
    assert p["diff"] == 0.5 and p["arm_only"] == 2 and p["reference_only"] == 0
    assert 0.0 <= p["ci95"][0] <= 0.5 <= p["ci95"][1] <= 1.0
    same = paired([True, False], [True, False])
    assert same["diff"] == 0.0 and same["ci95"] == [0.0, 0.0] and same["mcnemar_p"] == 1.0
    r = rate([True, False, False, False])
    assert r["k"] == 1 and r["n"] == 4 and r["wilson95"][0] < 0.25 < r["wilson95"][1]


def test_zero_coefficients_give_the_unsteered_samples_bitwise(zoo_base, zoo_vector, tmp_path):
    model, tok = zoo_base
    settings = _settings(
        samples=3,
        max_new_tokens=5,
        ck=0.0,
        cv=0.0,
        ca=0.0,
        arms=("none", "kv", "actadd", "random"),
        sweep=(1.0,),
        sweep_samples=2,
    )
    res = evaluate(model, tok, zoo_vector, scorer=positive_sentiment, settings=settings)
    none = res["arms"]["none"]
    assert none["cost"]["kl"] == 0.0 and none["cost"]["delta_nll"] == 0.0
    for arm in ("kv", "actadd", "random"):
        a = res["arms"][arm]
        assert a["scores"] == none["scores"] and a["examples"] == none["examples"], arm
        assert a["cost"]["kl"] == 0.0 and a["cost"]["delta_nll"] == 0.0, arm
        assert a["paired_vs_none"]["diff"] == 0.0
    assert set(res["sweep"]) == {"kv", "actadd", "random"} and res["sweep"]["kv"][0]["n"] == 2
    png = plot_sweep(res, tmp_path / "sweep.png")
    assert png and (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = "\n".join(lines(res))
    assert "| kv |" in text and "Wilson" in text


def test_steering_arms_change_the_samples_and_cost_something(zoo_base, zoo_vector):
    model, tok = zoo_base
    settings = _settings(
        samples=4,
        max_new_tokens=6,
        cv=8.0,
        ca=4.0,
        arms=("none", "visible", "pack", "kv", "actadd"),
        instruction="JULIET: speak of love.",
    )
    res = evaluate(model, tok, zoo_vector, scorer=positive_sentiment, settings=settings)
    assert res["arms"]["kv"]["cost"]["kl"] > 0 and res["arms"]["actadd"]["cost"]["kl"] > 0
    assert res["arms"]["pack"]["setup"]["method"].startswith("instruction in a pack")
    # the pack arm restores the guide with no forward pass; its cost is that of the visible guide
    assert math.isclose(
        res["arms"]["pack"]["cost"]["kl"], res["arms"]["visible"]["cost"]["kl"], rel_tol=1e-3, abs_tol=1e-6
    )
    with pytest.raises(Exception, match="needs the instruction"):
        evaluate(
            model,
            tok,
            zoo_vector,
            scorer=positive_sentiment,
            settings=_settings(samples=1, max_new_tokens=2, arms=("visible",)),
        )


def test_at_prompt_edits_every_cached_prompt_position(zoo_base, zoo_vector):
    model, tok = zoo_base
    base = dict(samples=2, max_new_tokens=4, ck=0.0, cv=8.0, arms=("none", "kv"))
    last = evaluate(model, tok, zoo_vector, scorer=positive_sentiment, settings=_settings(**base))
    every = evaluate(model, tok, zoo_vector, scorer=positive_sentiment, settings=_settings(**base, at="prompt"))
    n_prefix = len(tok("ROMEO: I will").input_ids) - 1
    assert last["arms"]["kv"]["setup"]["positions"] == [n_prefix - 1, n_prefix]
    assert every["arms"]["kv"]["setup"]["positions"] == [0, n_prefix]
    assert every["arms"]["kv"]["cost"]["kl"] != last["arms"]["kv"]["cost"]["kl"]
    assert "every prompt position" in "\n".join(lines(every))
    zero = evaluate(
        model, tok, zoo_vector, scorer=positive_sentiment, settings=_settings(**{**base, "cv": 0.0}, at="prompt")
    )
    assert (
        zero["arms"]["kv"]["examples"] == zero["arms"]["none"]["examples"] and zero["arms"]["kv"]["cost"]["kl"] == 0.0
    )
    with pytest.raises(KVBridgeError, match="--at must be one of last, prompt"):
        _settings(at="guide")


def test_a_prompt_and_new_tokens_beyond_the_model_positions_are_refused(zoo_base):
    from kvbridge.steer.prompts import prompt_scenario
    from kvbridge.steer.run import check_length

    model, tok = zoo_base
    scenario = prompt_scenario(tok, "ROMEO: my sweet love", chat=False)
    room = model.config.max_position_embeddings - len(scenario.joint)
    check_length(model, scenario, room)  # exactly the model's positions: fine
    with pytest.raises(KVBridgeError, match=f"--max-new-tokens {room + 1} after a") as err:
        check_length(model, scenario, room + 1)
    assert f"use --max-new-tokens {room} or less" in str(err.value)


def test_plot_sweep_without_matplotlib_is_none(tmp_path, monkeypatch):
    from kvbridge.evaluate import report

    monkeypatch.setattr(report, "pyplot", lambda: None)
    result = {"sweep": {"kv": []}, "arms": {"none": {"rate": 0.5}}}
    assert plot_sweep(result, tmp_path / "sweep.png") is None
    assert not (tmp_path / "sweep.png").exists()
