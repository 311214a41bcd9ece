"""The contracts every steering method and every behaviour scorer must pass (built-ins and plugins)::

    from kvbridge.plugin_types import Scorer
    from kvbridge.testing import ScorerContract, SteeringMethodContract

    class TestMyMethod(SteeringMethodContract):
        method = MyMethod                  # name, Options, plan(context, options) -> SteerPlan
        options = {"factor": 0.5}          # options under which it must change the run

    class TestMyScorer(ScorerContract):
        scorer = Scorer("shouting", "mostly upper case", shouts)
        positives = ["THIS IS LOUD TEXT"]
        negatives = ["this is quiet text"]

``SteeringMethodContract`` resolves the method through a plugin host (as ``kvbridge steer`` does)
and runs it on a tiny random Llama, a random steering vector (K, V and residual directions) and
another prompt's cache: the plan leaves the input state untouched, marks an edited state
``approximate=True``, changes the next-token distribution under ``options``, and under the
method's ``neutral`` options (all layers) gives bitwise the unsteered greedy run.
``ScorerContract`` checks that the scorer returns a bool, is deterministic, scores the examples
as declared and never raises on odd text (empty, control characters, deep brackets, long).
"""

from __future__ import annotations

import functools
from typing import Any

from kvbridge.plugins import get_host
from kvbridge.testing.contract import host_with_factory
from kvbridge.testing.planted import tiny_llama, token_ids

PROMPT_LEN, GREEDY_STEPS = 12, 6


@functools.lru_cache(maxsize=2)
def steer_fixture(seed: int = 0) -> dict:
    """A tiny Llama, a prompt and another prompt's cache, a random steering vector (cached)."""
    import torch

    from kvbridge.steer.vectors import SteeringVector

    model = tiny_llama(seed=seed)
    adapter = get_host().adapter_for(model.config.to_dict())
    spec = adapter.spec_of(model)
    ids = token_ids(2, PROMPT_LEN, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    keys = tuple(torch.randn(spec.kv_heads_of(i), spec.key_dim_of(i), generator=g) for i in range(spec.num_layers))
    values = tuple(torch.randn(spec.kv_heads_of(i), spec.value_dim_of(i), generator=g) for i in range(spec.num_layers))
    resid = tuple(torch.randn(spec.hidden_size, generator=g) for _ in range(spec.num_layers))
    vector = SteeringVector(keys, values, resid, spec, "content", {"method": "random (contract)"})
    state = adapter.extract(model, ids[:1, :-1])
    other = adapter.extract(model, ids[1:, :-1])
    return {"model": model, "spec": spec, "state": state, "other": other, "live": (int(ids[0, -1]),), "vector": vector}


def _greedy(model, setup):
    from kvbridge.steer.sample import sample

    return sample(model, setup, [0], GREEDY_STEPS, None, return_logits=True)


def check_method(method: Any, options: dict, *, layers=None, start: int = 0, stop: int | None = None) -> dict:
    """Run the contract's checks on ``method`` (a class, an instance or a ``SteeringMethod`` record)."""
    import torch

    from kvbridge.steer.edit import layers_of
    from kvbridge.steer.methods import SteerContext, method_options, method_problem
    from kvbridge.steer.sample import Setup

    host, record = host_with_factory("steering_method", method)
    cls = record.load()
    assert method_problem(cls) is None, f"{record.name}: missing protocol member {method_problem(cls)!r}"
    m = host.get("steering_method", record.name)
    fx = steer_fixture()
    model, state = fx["model"], fx["state"]
    stop = state.num_tokens if stop is None else stop
    before = state.clone()

    def plan(opts: dict, chosen):
        ctx = SteerContext(
            model=model,
            spec=fx["spec"],
            state=state,
            start=start,
            stop=stop,
            layers=layers_of(chosen, fx["spec"].num_layers),
            vector=fx["vector"],
            other=fx["other"],
        )
        return m.plan(ctx, method_options(m, opts))

    base = _greedy(model, Setup(state, fx["live"]))
    steered_plan = plan(options, layers)
    for a, b in zip((*state.keys, *state.values), (*before.keys, *before.values)):
        assert torch.equal(a, b), f"{record.name}: plan() modified the input state"
    if steered_plan.state is not state:
        assert steered_plan.state.approximate, f"{record.name}: an edited state must be marked approximate=True"
    steered = _greedy(model, Setup(steered_plan.state, fx["live"], steered_plan.hooks))
    changed = not torch.equal(steered["first_logits"], base["first_logits"])
    assert changed, f"{record.name}: options {options} leave the next-token distribution unchanged"
    neutral = getattr(cls, "neutral", None)
    if neutral is not None:
        np = plan(dict(neutral), None)
        got = _greedy(model, Setup(np.state, fx["live"], np.hooks))
        assert torch.equal(got["first_logits"], base["first_logits"]), (
            f"{record.name}: neutral options {neutral} change the next-token logits"
        )
        assert got["tokens"] == base["tokens"], f"{record.name}: neutral options {neutral} change the greedy run"
    return {"changed": changed, "neutral_checked": neutral is not None}


class SteeringMethodContract:
    """Subclass with ``method`` (class or record) and ``options`` (they must change the run)."""

    method: Any = None
    options: dict = {}
    layers: Any = None  # None = all layers

    def test_follows_the_contract(self):
        check_method(self.method, dict(self.options), layers=self.layers)


ODD_TEXTS = (
    "",
    " ",
    "\x00\x01\n\t",
    "{" * 5000,
    "]" * 100 + "}" * 100,
    "🙂 ünïcödé 中文",
    "- a\n" * 2000,
    "```\n" * 50,
    "# " * 1000,
)


def check_scorer(scorer: Any, positives=(), negatives=()) -> dict:
    host, record = host_with_factory("scorer", scorer)
    fn = host.get("scorer", record.name)
    for text in (*positives, *negatives, *ODD_TEXTS):
        got = fn(text)
        assert isinstance(got, bool), f"{record.name}({text[:30]!r}) returned {type(got).__name__}, not bool"
        assert fn(text) is got, f"{record.name} is not deterministic on {text[:30]!r}"
    for text in positives:
        assert fn(text), f"{record.name} should score True: {text[:60]!r}"
    for text in negatives:
        assert not fn(text), f"{record.name} should score False: {text[:60]!r}"
    return {"checked": len(positives) + len(negatives) + len(ODD_TEXTS)}


class ScorerContract:
    """Subclass with ``scorer`` (a ``Scorer`` record or a function) and example ``positives`` / ``negatives``."""

    scorer: Any = None
    positives: tuple = ()
    negatives: tuple = ()

    def test_follows_the_contract(self):
        assert self.positives and self.negatives, "give at least one positive and one negative example"
        check_scorer(self.scorer, self.positives, self.negatives)
