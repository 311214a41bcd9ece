"""Work the harness does not repeat: a one-model pair prefills each context once, and a request
answered from a cache bitwise equal to an earlier condition's reuses that answer. Both give the
answers of a run that repeats everything (no threshold)."""

from __future__ import annotations

import dataclasses

import pytest
import torch


@pytest.fixture(scope="module")
def tasks(mc_file):
    from kvbridge.harness.run import load_tasks

    return load_tasks(
        ["recall", "mc"],
        {
            "recall": {"lengths": "48", "positions": "0.2,0.8", "n": "1", "max_new_tokens": "4"},
            "mc": {"path": str(mc_file)},
        },
    )


def _answers(res):
    return {name: [(r["id"], r["scores"], r["answers"]) for r in recs] for name, recs in res["items"].items()}


def test_reuse_gives_the_answers_of_a_run_that_repeats_everything(base, tasks, monkeypatch):
    import kvbridge.harness.conditions as conditions
    from kvbridge.harness.run import run_harness
    from kvbridge.transfer import IdentityMapping

    model, tok = base
    fast = run_harness(model, model, IdentityMapping(), tok, tasks, bootstrap=0)
    # recall: 2 items, target/source/transferred/plain hold one cache (3 answers reused each);
    # mc: 3 items, 8 choices, the same for each choice
    assert fast["timing"]["reused"] == {"prefills": 2 + 3, "answers": 3 * 2 + 3 * 8}
    assert fast["timing"]["target_prefill_s"] == 0.0

    monkeypatch.setattr(conditions, "same_cache", lambda a, b: False)
    orig_init = conditions.Answerer.__init__

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        self.one_model = False

    monkeypatch.setattr(conditions.Answerer, "__init__", init)
    slow = run_harness(model, model, IdentityMapping(), tok, tasks, bootstrap=0)
    assert slow["timing"]["reused"] == {"prefills": 0, "answers": 0} and slow["timing"]["target_prefill_s"] > 0
    assert _answers(fast) == _answers(slow)
    assert fast["tasks"] == slow["tasks"]


def test_loglikelihood_reused_only_for_the_same_cache(base):
    from kvbridge.harness.conditions import Answerer

    model, tok = base

    @dataclasses.dataclass(frozen=True)
    class Nudge:  # a mapping that moves one value: the transferred cache differs from the source's
        exact: bool = False
        name: str = "nudge"

        def map_content(self, state, target_spec):
            values = list(state.values)
            values[0] = values[0] + 0.5
            return dataclasses.replace(state, values=tuple(values), spec=target_spec)

    ans = Answerer(model, model, Nudge(), tok)
    ctx = tok("To be, or not to be:", add_special_tokens=True)["input_ids"]
    live = tok(" that is", add_special_tokens=False)["input_ids"]
    cont = tok(" the question", add_special_tokens=False)["input_ids"]
    got = {c: ans.loglikelihood(c, ctx, live, cont) for c in ("target", "source", "transferred", "plain")}
    assert ans.reused == {"prefills": 1, "answers": 2}  # source and plain: the target's cache
    assert got["source"] == got["target"] == got["plain"] and got["transferred"] != got["target"]


def test_same_cache_compares_every_tensor(base):
    from kvbridge.harness.conditions import same_cache
    from kvbridge.plugins import get_host

    model, tok = base
    ad = get_host().adapter_of(model)
    ids = torch.tensor([tok("a small test", add_special_tokens=True)["input_ids"]])
    a, b = ad.extract(model, ids), ad.extract(model, ids)
    assert a is not b and same_cache(a, b) and same_cache(None, None) and not same_cache(a, None)
    keys = list(b.keys)
    keys[-1] = keys[-1].clone()
    keys[-1][0, 0, -1, -1] += 1e-3
    assert not same_cache(a, dataclasses.replace(b, keys=tuple(keys)))
    assert not same_cache(a, dataclasses.replace(b, positions=b.positions + 1))
