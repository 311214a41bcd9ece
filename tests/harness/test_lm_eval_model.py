"""The lm-eval model ``kvbridge`` through lm-eval's own evaluator, and lm-eval tasks inside the harness:
a local task (dataset_path: json) runs offline; a hub-only task is refused in one line."""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf-datasets")))
    yield
    mp.undo()


def test_registered_and_scored_by_lm_eval(offline, base, lm_eval_dir):
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    import kvbridge.harness.lm_eval_model as mod
    from kvbridge.harness.conditions import Answerer
    from kvbridge.transfer import IdentityMapping

    assert get_model("kvbridge") is mod.KVBridgeLM
    model, tok = base
    tm = TaskManager(include_path=str(lm_eval_dir), include_defaults=False)
    accs = {}
    for cond in ("target", "transferred"):
        lm = mod.KVBridgeLM(answerer=Answerer(model, model, IdentityMapping(), tok), condition=cond)
        res = lm_eval.simple_evaluate(
            model=lm, tasks=["kvb_mc", "kvb_gen"], task_manager=tm, log_samples=True, verbosity="ERROR"
        )
        accs[cond] = [s["acc"] for s in res["samples"]["kvb_mc"]]
        assert res["results"]["kvb_gen"]["sample_len"] == 3 and lm.counts["generate_until"] == 3
        assert lm.counts["loglikelihood"] == 3 + 2 + 3  # one request per choice
    assert accs["transferred"] == accs["target"]  # an exact transfer: the same answers


def test_model_args_refusals(base):
    from kvbridge.errors import KVBridgeError
    from kvbridge.harness.conditions import Answerer
    from kvbridge.harness.lm_eval_model import KVBridgeLM
    from kvbridge.transfer import IdentityMapping

    with pytest.raises(KVBridgeError, match="needs source= and target="):
        KVBridgeLM.create_from_arg_string("mapping=identity")
    lm = KVBridgeLM.create_from_arg_string(
        "source=zoo:base,target=zoo:base,mapping=identity,condition=target,dtype=float32,max_gen_toks=17,"
        "rolling_window=9,accept_fingerprint_mismatch=false,tokenizer=ignored",
        {"batch_size": 1, "device": "cpu"},
    )
    assert lm.condition == "target" and lm.get_model_info()["kvbridge_target_layers"] == 4
    assert (lm.max_gen_toks, lm.rolling_window) == (17, 9) and lm.tok is lm.answerer.tokenizer
    model, tok = base
    with pytest.raises(KVBridgeError, match="unknown condition 'moved'"):
        KVBridgeLM(answerer=Answerer(model, model, IdentityMapping(), tok), condition="moved")


def test_an_empty_context_is_the_special_prefix_else_eos():
    from kvbridge.harness.lm_eval_model import KVBridgeLM

    class Tok:  # adds BOS 1 when asked for special tokens, when ``bos``
        eos_token_id = 2

        def __init__(self, bos):
            self.bos = bos

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": ([1] if add_special_tokens and self.bos else []) + [7] * len(text.split())}

    lm = object.__new__(KVBridgeLM)
    lm.tok = Tok(bos=True)
    assert lm.prefix_ids() == [1] and lm._context("") == [1] and lm._context("a b") == [1, 7, 7]
    lm.tok = Tok(bos=False)
    assert lm.prefix_ids() == [2] and lm._context("") == [2] and lm._context("a b") == [7, 7]


def test_rolling_windows_sum_to_the_full_score(base):
    from types import SimpleNamespace

    import torch

    from kvbridge.harness.conditions import Answerer
    from kvbridge.harness.lm_eval_model import KVBridgeLM
    from kvbridge.transfer import IdentityMapping

    model, tok = base
    text = "ROMEO: But soft, what light through yonder window breaks? It is the east."
    lm = KVBridgeLM(answerer=Answerer(model, model, IdentityMapping(), tok), condition="transferred", rolling_window=7)
    got = lm.loglikelihood_rolling([SimpleNamespace(args=(text,))])[0]
    ids = lm.prefix_ids() + list(tok(text, add_special_tokens=False)["input_ids"])
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    want = float(logp[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).sum())
    assert got == pytest.approx(want, abs=1e-3)


def test_lm_eval_tasks_in_the_harness(offline, base, lm_eval_dir):
    from kvbridge.harness.lm_eval_tasks import lm_eval_loaded_tasks, lm_eval_task_specs
    from kvbridge.harness.run import run_harness
    from kvbridge.transfer import IdentityMapping

    model, tok = base
    specs = lm_eval_task_specs([str(lm_eval_dir / "kvb_mc.yaml"), "kvb_gen"], include_path=str(lm_eval_dir))
    assert [s.name for s in specs] == ["kvb_mc", "kvb_gen"]
    res = run_harness(model, model, IdentityMapping(), tok, lm_eval_loaded_tasks(specs), bootstrap=20)
    mc = res["tasks"]["lm-eval:kvb_mc"]
    assert mc["n"] == 3 and mc["floor"] == pytest.approx((1 / 3 + 1 / 2 + 1 / 3) / 3)
    assert "no_context" not in mc["conditions"]
    for rec in res["items"]["lm-eval:kvb_mc"] + res["items"]["lm-eval:kvb_gen"]:
        assert rec["answers"]["transferred"] == rec["answers"]["target"]


def test_hub_only_and_unknown_tasks_are_refused(lm_eval_dir):
    from kvbridge.errors import KVBridgeError
    from kvbridge.harness.lm_eval_tasks import lm_eval_task_specs

    with pytest.raises(KVBridgeError, match="from the Hugging Face hub.*someone/some-dataset.*dataset_path: json"):
        lm_eval_task_specs([str(lm_eval_dir / "hub_task.yaml")])
    with pytest.raises(KVBridgeError, match="unknown lm-eval task 'no_such_task_xyz'"):
        lm_eval_task_specs(["no_such_task_xyz"], include_path=str(lm_eval_dir))
