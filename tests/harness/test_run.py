"""The harness engine on the zoo's base model: every condition answers from the same ids; an identity
transfer and a full recompute reproduce the target's answers exactly (no threshold)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tasks(mc_file):
    from kvbridge.harness.run import load_tasks

    return load_tasks(
        ["recall", "mc"],
        {
            "recall": {"lengths": "48", "positions": "0.5", "n": "2", "max_new_tokens": "4"},
            "mc": {"path": str(mc_file)},
        },
    )


def test_identity_transfer_answers_as_the_target(base, tasks):
    from kvbridge.harness.run import SCHEMA, run_harness
    from kvbridge.transfer import IdentityMapping

    model, tok = base
    res = run_harness(model, model, IdentityMapping(), tok, tasks, bootstrap=50)
    assert res["schema"] == SCHEMA and res["conditions"] == ["target", "source", "transferred", "plain", "no_context"]
    for name, records in res["items"].items():
        for rec in records:  # same model, exact transfer: the very same answers
            for cond in ("source", "transferred", "plain"):
                assert rec["answers"][cond] == rec["answers"]["target"], (name, rec["id"], cond)
    mc = res["tasks"]["mc"]
    assert mc["n"] == 3 and mc["floor"] == pytest.approx((1 / 3 + 1 / 2 + 1 / 3) / 3)
    assert res["overall"]["n"] == 5 and set(res["overall"]["conditions"]) == set(res["conditions"])
    assert "len=48 pos=0.50" in res["tasks"]["recall"]["groups"]


def test_full_recompute_restores_the_target_from_a_noisy_transfer(base, tasks, noisy):
    from kvbridge.harness.conditions import parse_recompute_layers
    from kvbridge.harness.run import run_harness

    model, tok = base
    points = parse_recompute_layers("all;50%", model.config.num_hidden_layers)
    assert [p.layers for p in points] == [(0, 1, 2, 3), (0, 1)]
    res = run_harness(
        model,
        model,
        noisy(3.0),
        tok,
        tasks,
        recompute_layers="all;50%",
        bootstrap=0,
        conditions=["target", "transferred", "transferred+layers:all", "transferred+layers:50%"],
    )
    for records in res["items"].values():
        for rec in records:
            assert rec["answers"]["transferred+layers:all"] == rec["answers"]["target"]
    assert res["tasks"]["mc"]["retention"]["ci"] is None  # no bootstrap asked


def test_loglikelihood_matches_a_plain_forward(base):
    """The cached path scores a continuation as one full forward of context + continuation does."""
    from kvbridge.harness.conditions import Answerer
    from kvbridge.transfer import IdentityMapping

    model, tok = base
    ans = Answerer(model, model, IdentityMapping(), tok)
    ctx = tok("To be, or not to be:", add_special_tokens=True)["input_ids"]
    live = tok(" that is", add_special_tokens=False)["input_ids"]
    cont = tok(" the question", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + live + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), -1)
    n = len(cont)
    want = float(logp[-n - 1 : -1].gather(-1, torch.tensor(cont)[:, None]).sum())
    for cond in ("target", "transferred", "source"):
        got, _ = ans.loglikelihood(cond, ctx, live, cont)
        assert got == pytest.approx(want, abs=1e-3)
    got, _ = ans.loglikelihood("no_context", [], ctx + live, cont)
    assert got == pytest.approx(want, abs=1e-3)


def test_refusals(base, tasks):
    from kvbridge.errors import KVBridgeError
    from kvbridge.harness.run import load_tasks, run_harness
    from kvbridge.transfer import IdentityMapping

    model, tok = base
    with pytest.raises(KVBridgeError, match="unknown condition 'transfered'"):
        run_harness(model, model, IdentityMapping(), tok, tasks, conditions=["transfered"])
    with pytest.raises(KVBridgeError, match="code execution is not allowed"):
        run_harness(model, model, IdentityMapping(), tok, load_tasks(["humaneval"], {"humaneval": {"limit": "1"}}))


def test_humaneval_runs_with_code_execution_allowed(base):
    from kvbridge.harness.run import load_tasks, run_harness
    from kvbridge.transfer import IdentityMapping

    model, tok = base
    tasks = load_tasks(["humaneval"], {"humaneval": {"problems": "0", "max_new_tokens": "4", "timeout_s": "5"}})
    res = run_harness(model, model, IdentityMapping(), tok, tasks, allow_code_execution=True, bootstrap=0)
    he = res["tasks"]["humaneval"]
    assert he["n"] == 1 and "no_context" not in he["conditions"] and he["floor"] == 0
    assert any("no no_context condition" in n for n in res["notes"])
    rec = res["items"]["humaneval"][0]
    assert rec["id"] == "HumanEval/0" and rec["answers"]["transferred"] == rec["answers"]["target"]
    assert rec["scores"]["target"] in (0.0, 1.0)


def test_resummarize_reproduces_the_summaries(base, tasks):
    from kvbridge.harness.run import resummarize, run_harness
    from kvbridge.transfer import IdentityMapping

    model, tok = base
    res = run_harness(model, model, IdentityMapping(), tok, tasks, bootstrap=40, seed=2)
    again = resummarize(res)
    assert again["tasks"] == res["tasks"] and again["overall"] == res["overall"]
    assert resummarize(res, bootstrap=0)["tasks"]["mc"]["retention"]["ci"] is None


def test_token_recompute_point_runs(base, tasks, noisy):
    from kvbridge.harness.conditions import parse_recompute_tokens
    from kvbridge.harness.run import run_harness

    model, tok = base
    points = parse_recompute_tokens("15%,100%")
    assert [p.name for p in points] == ["transferred+tokens:15%", "transferred+tokens:100%"]
    res = run_harness(
        model,
        model,
        noisy(1.0),
        tok,
        tasks[1:],
        recompute_tokens="15%,100%",
        bootstrap=0,
        conditions=["target", "transferred+tokens:15%"],
    )
    assert res["conditions"] == ["target", "transferred+tokens:15%"] and res["timing"]["recompute_s"] > 0


def test_no_context_keeps_the_tokenizers_special_prefix():
    """no_context feeds the BOS a tokenizer adds to empty text (and nothing where it adds none)."""
    from kvbridge.harness.protocol import ChoiceItem
    from kvbridge.harness.run import answer_one

    class Tok:
        def __init__(self, bos):
            self.bos = bos

        def __call__(self, text, add_special_tokens=True):
            ids = [ord(c) for c in text]
            return {"input_ids": ([self.bos] if add_special_tokens and self.bos is not None else []) + ids}

    class Recorder:
        def __init__(self):
            self.seen = []

        def loglikelihood(self, cond, ctx, query, cont):
            self.seen.append((cond, list(ctx)))
            return (-float(len(cont)), True)

    item = ChoiceItem(id="1", context="ab", query="q", choices=("x", "yy"), gold=0)
    for bos, want in ((7, [7]), (None, [])):
        ans = Recorder()
        answer_one(ans, object(), item, "no_context", Tok(bos))
        assert {tuple(ctx) for _, ctx in ans.seen} == {tuple(want)}
        ans = Recorder()
        answer_one(ans, object(), item, "target", Tok(bos))
        assert {tuple(ctx) for _, ctx in ans.seen} == {tuple(want + [ord("a"), ord("b")])}
