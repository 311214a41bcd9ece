"""The contract every metric must pass (see :mod:`kvbridge.testing.fitter_contract` for the fitter one)::

    from kvbridge.plugin_types import Metric
    from kvbridge.testing import MetricContract

    class TestMyMetric(MetricContract):
        metric = Metric("my_metric", "what it measures", "my_pkg.metrics:my_metric", higher_is_better=True)

The metric is resolved through a plugin host (as ``kvbridge eval`` does) and run, through
kvbridge's own summariser, on synthetic per-sample fields of three conditions: ``native``
(the reference), ``copy`` (exactly native's arrays: a perfect transfer) and ``noisy`` (worse
than native). It must give one finite number or ``nan`` per condition and replicate, never
raise, agree between the point estimate and a bootstrap of identical samples, and, if it
declares ``ideal`` (the value of a perfect copy), give it on ``copy``.
"""

from __future__ import annotations

import math
from typing import Any

from kvbridge.testing.contract import host_with

#: per-sample fields of a view (``N`` samples, ``C`` positions, ``L`` layers, ``G`` greedy steps)
N, C, L, G = 6, 5, 3, 4


def synthetic_fields(seed: int = 0) -> dict:
    """``{condition: {field: tensor}}`` shaped like :func:`kvbridge.evaluate.conditions.run_conditions`."""
    import torch

    g = torch.Generator().manual_seed(seed)
    native = {
        "nll": 1.0 + torch.rand(N, C, generator=g, dtype=torch.float64),
        "correct": (torch.rand(N, C, generator=g) < 0.6).double(),
    }
    zero_pos, ones_pos = torch.zeros(N, C, dtype=torch.float64), torch.ones(N, C, dtype=torch.float64)
    copy = {
        **native,
        "kl": zero_pos,
        "top1": ones_pos,
        "topk": ones_pos,
        "tv": zero_pos,
        "max_abs_logit_diff": torch.zeros(N, dtype=torch.float64),
        "greedy_div": torch.full((N,), float(G)),
        "attn_cos": torch.ones(N, L, dtype=torch.float64),
    }
    noisy = {
        "nll": native["nll"] + 0.5 * torch.rand(N, C, generator=g, dtype=torch.float64),
        "correct": native["correct"] * (torch.rand(N, C, generator=g) < 0.7).double(),
        "kl": 0.3 * torch.rand(N, C, generator=g, dtype=torch.float64),
        "top1": (torch.rand(N, C, generator=g) < 0.8).double(),
        "topk": 0.6 * ones_pos,
        "tv": 0.2 * ones_pos,
        "max_abs_logit_diff": 2.0 + torch.rand(N, generator=g, dtype=torch.float64),
        "greedy_div": torch.randint(0, G, (N,), generator=g).double(),
        "attn_cos": 0.8 + 0.1 * torch.rand(N, L, generator=g, dtype=torch.float64),
    }
    no_prefix = {"nll": native["nll"] + 1.0, "correct": native["correct"] * 0.0}
    # the references every compared condition carries (what evaluate.fields.stack_fields gives them)
    refs = {
        f"{name}_{k}": f[k] for name, f in (("native", native), ("no_prefix", no_prefix)) for k in ("nll", "correct")
    }
    for cond in (copy, noisy):
        cond.update(refs)
    return {"native": native, "copy": copy, "noisy": noisy, "no_prefix": no_prefix}


class _Run:
    """The slice of :class:`kvbridge.evaluate.conditions.ConditionRun` that ``summarize`` reads."""

    def __init__(self, fields: dict):
        from kvbridge.evaluate.settings import EvalSettings

        self.fields = fields
        self.config = EvalSettings(greedy_tokens=G)
        self.num_samples = N


def check_metric(metric: Any, *, ideal: float | None = None, seed: int = 0) -> dict:
    """Point values per condition, bootstrap-consistent, ``ideal`` on a perfect copy (when given)."""
    from kvbridge.evaluate.metrics import resolve_metrics, summarize

    m = resolve_metrics(host_with("metric", metric), [metric.name])[0]  # as `kvbridge eval` loads it
    fields = synthetic_fields(seed)
    summary = summarize(_Run(fields), [m], bootstrap=20, seed=seed)
    values = {c: summary["conditions"][c][m.name] for c in fields}
    for cond, v in values.items():
        assert isinstance(v, float), f"{m.name} on {cond}: {v!r} is not a number"
        assert math.isfinite(v) or math.isnan(v), f"{m.name} on {cond}: {v} is infinite"
    # identical samples: every bootstrap replicate equals the point estimate
    same = {c: {k: t[:1].expand_as(t).clone() for k, t in f.items()} for c, f in fields.items()}
    flat = summarize(_Run(same), [m], bootstrap=8, seed=seed)
    for cond, row in flat["conditions"].items():
        lo, hi = row[f"{m.name}_ci"]
        if not math.isnan(row[m.name]) and lo is not None and not math.isnan(lo):
            assert abs(lo - row[m.name]) <= 1e-9 * max(1.0, abs(row[m.name])) and abs(hi - lo) <= 1e-9 * max(
                1.0, abs(hi)
            ), f"{m.name} on {cond}: bootstrap of identical samples varies ({lo}, {hi})"
    if ideal is not None:
        assert abs(values["copy"] - ideal) <= 1e-9, f"{m.name} on a perfect copy is {values['copy']}, not {ideal}"
        if not math.isnan(values["noisy"]):
            better = (values["copy"] >= values["noisy"]) if m.higher_is_better else (values["copy"] <= values["noisy"])
            assert better, f"{m.name}: the perfect copy ({values['copy']}) is not better than noise ({values['noisy']})"
    return values


class MetricContract:
    """Subclass with ``metric = Metric(...)`` (and ``ideal`` when a perfect copy has a known value)."""

    metric: Any = None
    ideal: float | None = None

    def test_description_and_direction(self):
        assert self.metric.name and self.metric.description, "a metric needs a name and a one-line description"
        assert isinstance(self.metric.higher_is_better, bool)

    def test_values_on_every_condition(self):
        check_metric(self.metric, ideal=self.ideal)
