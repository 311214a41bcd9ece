"""The metric contract runs on every built-in metric (and catches a broken one)."""

from __future__ import annotations

import pytest

from kvbridge.builtin.metrics import METRICS
from kvbridge.errors import KVBridgeError
from kvbridge.plugin_types import Metric
from kvbridge.testing import MetricContract
from kvbridge.testing.metric_contract import G, check_metric

#: the value a perfect copy of native's outputs must get (None: depends on the samples)
IDEAL = {
    "nll_delta": 0.0,
    "kl_mean": 0.0,
    "kl_p95": 0.0,
    "top1_agreement": 1.0,
    "topk_overlap": 1.0,
    "tv_top_p": 0.0,
    "max_abs_logit_diff": 0.0,
    "gap_recovered": 1.0,
    "retention": 1.0,
    "retention_floor": 1.0,
    "greedy_first_divergence": float(G),
    "greedy_agreement": 1.0,
    "attention_cosine_mean": 1.0,
    "attention_cosine_min": 1.0,
}

for _m in METRICS:  # one contract class per built-in metric
    globals()[f"TestMetric_{_m.name}"] = type(
        f"TestMetric_{_m.name}", (MetricContract,), {"metric": _m, "ideal": IDEAL.get(_m.name)}
    )


def _misspelt(view):
    return view["nl"].double().flatten(1).mean(1)  # the field is "nll"


def test_a_metric_that_raises_is_an_error_naming_it_and_its_plugin():
    with pytest.raises(KVBridgeError) as err:
        check_metric(Metric("misspelt", "reads a field that does not exist", _misspelt))
    msg = err.value.one_line() if hasattr(err.value, "one_line") else str(err.value)
    assert "metric 'misspelt' (plugin 'contract-misspelt')" in msg and "KeyError" in msg and "\n" not in msg


def test_the_contract_catches_a_wrong_ideal():
    with pytest.raises(AssertionError, match="perfect copy"):
        check_metric(next(m for m in METRICS if m.name == "kl_mean"), ideal=1.0)
