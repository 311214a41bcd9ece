"""The condition runner: shared prefills computed once per batch, and a condition added from outside."""

from __future__ import annotations

import torch

from .conftest import C, P


def test_batch_once_computes_and_times_a_shared_prefill_once():
    from kvbridge.evaluate.runner import Batch

    calls, timing = [], {}
    bt = Batch(torch.arange(2), torch.zeros(2, 1), torch.zeros(2, 1), {}, timing)
    first = bt.once("native", lambda: calls.append(1) or "state", "target_prefill_s")
    again = bt.once("native", lambda: calls.append(1) or "other", "target_prefill_s")
    assert (first, again, len(calls)) == ("state", "state", 1)
    assert set(timing) == {"target_prefill_s"} and timing["target_prefill_s"] >= 0


def test_run_items_answers_each_item_under_each_condition_in_order():
    from kvbridge.evaluate.runner import Built, Condition, run_items

    seen = []
    answer = lambda item, name: seen.append((item, name)) or f"{name}:{item}"  # noqa: E731
    conds = [Condition("ref", lambda bt: Built()), "other"]  # a Condition or a plain name
    assert run_items(conds, [1, 2], answer) == [
        {"ref": "ref:1", "other": "other:1"},
        {"ref": "ref:2", "other": "other:2"},
    ]
    assert seen == [(1, "ref"), (1, "other"), (2, "ref"), (2, "other")]  # item by item, the reference first
    records = run_items(["a"], ["x"], lambda item, name: 0.5, after_item=lambda item, v: {"id": item, **v})
    assert records == [{"id": "x", "a": 0.5}] and run_items(["a"], [], answer) == []


def test_a_context_batch_keeps_its_memo_across_calls():
    from kvbridge.evaluate.runner import context_batch

    memo, timing = {}, {}
    bt = context_batch((5, 6, 7), timing, memo)
    assert bt.parts["prefix"].tolist() == [[5, 6, 7]] and len(bt.index) == 1 and bt.total == 1
    bt.once("native", lambda: "state", "target_prefill_s")
    again = context_batch((5, 6, 7), timing, memo)
    assert again.once("native", lambda: "other") == "state" and "target_prefill_s" in timing


def test_an_extra_condition_reuses_the_runs_source_prefill(base, samples, host):
    from kvbridge.builtin.identity import IdentityMapping
    from kvbridge.evaluate.conditions import run_conditions
    from kvbridge.evaluate.settings import EvalSettings
    from kvbridge.evaluate.runner import Built, Condition

    prefills = []

    def again(pre):  # the transferred cache once more, under another name, counting source prefills
        def hook(run):
            prefills.append(1)
            return run(), None

        pre.hook = hook
        return Condition("again", lambda bt: Built(pre.transferred(bt)))

    cfg = EvalSettings(
        prefix_len=P,
        continuation_len=C,
        greedy_tokens=2,
        batch_size=5,
        conditions=("native", "transferred", "shuffled", "no_prefix"),
    )
    run = run_conditions(base[0], base[0], IdentityMapping(), samples, cfg, host=host, extra=[again])
    n = samples.shape[0]
    assert list(run.fields) == ["native", "transferred", "no_prefix", "shuffled", "again"]
    assert len(prefills) == -(-n // cfg.batch_size)  # one source prefill per batch serves all three
    for key in ("nll", "kl", "greedy_div", "attn_cos"):
        assert torch.equal(run.fields["again"][key], run.fields["transferred"][key]), key
    assert torch.equal(run.fields["again"]["no_prefix_nll"], run.fields["no_prefix"]["nll"])
    assert not torch.equal(run.fields["shuffled"]["nll"], run.fields["transferred"]["nll"])


def test_one_forward_per_condition_and_the_stacked_forwards_agree(base, samples, host):
    from kvbridge.builtin.identity import IdentityMapping
    from kvbridge.evaluate.runner import Prefills

    def run(greedy):
        pre = Prefills(base[0], base[0], IdentityMapping(), host=host)
        conds = pre.conditions("native", "transferred", "source", "no_prefix")
        return pre.run(conds, samples[:6], P, C, 3, greedy=greedy)

    (plain, cost), (stacked, _) = run(None), run(2)
    assert list(plain) == list(stacked) == ["native", "transferred", "source", "no_prefix"]
    assert "greedy_div" not in plain["native"] and stacked["native"]["greedy_div"].eq(2).all()
    assert "attn_cos" in plain["transferred"] and "attn_cos" not in plain["source"]
    for cond in plain:
        for key in ("nll", "kl", "no_prefix_nll"):
            torch.testing.assert_close(plain[cond][key], stacked[cond][key], rtol=0, atol=1e-5)
    assert cost["transferred"] == {"flops": 0.0, "seconds": 0.0, "rows": 0}


def test_every_condition_set_refuses_a_mapping_fitted_for_another_geometry(base, samples, host):
    """The check sits in ``Prefills``, so the curve and the frontier refuse what eval refuses."""
    from types import SimpleNamespace

    import pytest

    from kvbridge.errors import KVBridgeError
    from kvbridge.evaluate.runner import Prefills

    model = base[0]
    spec = host.adapter_of(model).spec_of(model)
    other = SimpleNamespace(num_layers=spec.num_layers + 1, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)
    wrong = SimpleNamespace(source_spec=other, target_spec=spec)
    with pytest.raises(KVBridgeError, match=r"fitted for a source with \(layers, kv_heads, head_dim\)"):
        Prefills(model, model, wrong, host=host)
    Prefills(model, model, SimpleNamespace(source_spec=spec, target_spec=spec), host=host)  # the right one passes
