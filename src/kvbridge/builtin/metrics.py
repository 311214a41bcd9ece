"""The built-in quality metrics, as one plugin (imports nothing heavy).

Each factory is a function of :mod:`kvbridge.evaluate.metrics` taking an
:class:`~kvbridge.evaluate.metrics.EvalView` and returning a float; it is imported only when
``kvbridge eval`` (or :func:`kvbridge.evaluate.evaluate`) computes metrics.
"""

from __future__ import annotations

from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Metric


def _metric(name: str, description: str, higher_is_better: bool) -> Metric:
    """A metric whose factory is the function of the same name in kvbridge.evaluate.metrics."""
    return Metric(name, description, f"kvbridge.evaluate.metrics:{name}", higher_is_better)


METRICS = (
    _metric("nll", "mean continuation negative log-likelihood (nats/token)", False),
    _metric("perplexity", "exp(nll) of the continuation", False),
    _metric("nll_delta", "nll minus native nll on the same samples", False),
    _metric("accuracy", "teacher-forced next-token accuracy on the continuation", True),
    _metric("kl_mean", "mean KL(native || x) over continuation positions (nats)", False),
    _metric("kl_p95", "95th percentile of KL(native || x) over continuation positions", False),
    _metric("top1_agreement", "share of positions whose argmax equals native's", True),
    _metric("topk_overlap", "mean |top-k(x) & top-k(native)| / k", True),
    _metric("tv_top_p", "total-variation distance after top-p truncation", False),
    _metric("max_abs_logit_diff", "max |logit_x - logit_native|", False),
    _metric("gap_recovered", "(NLL_no_prefix - NLL_x) / (NLL_no_prefix - NLL_native)", True),
    _metric("retention", "acc_x / acc_native (the papers' retention; overstates benefit)", True),
    _metric("retention_floor", "(acc_x - acc_no_prefix) / (acc_native - acc_no_prefix)", True),
    _metric("greedy_first_divergence", "mean first greedy step that leaves native's tokens (G if none)", True),
    _metric("greedy_agreement", "greedy tokens matching native before the first divergence / G", True),
    _metric("attention_cosine_mean", "attention-output cosine vs native prefix K/V, mean over target layers", True),
    _metric("attention_cosine_min", "attention-output cosine vs native prefix K/V, min over target layers", True),
)


@hookimpl
def kvbridge_register_metrics(register):
    for metric in METRICS:
        register(metric)
