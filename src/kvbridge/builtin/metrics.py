"""The built-in quality metrics, as one plugin (imports nothing heavy).

Each factory is a function of :mod:`kvbridge.evaluate.metrics` taking an
:class:`~kvbridge.evaluate.metrics.EvalView` and returning a float; it is imported only when
``kvbridge eval`` (or :func:`kvbridge.evaluate.evaluate`) computes metrics.
"""

from __future__ import annotations

from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Metric

_M = "kvbridge.evaluate.metrics:"

METRICS = (
    Metric("nll", "mean continuation negative log-likelihood (nats/token)", _M + "nll", False),
    Metric("perplexity", "exp(nll) of the continuation", _M + "perplexity", False),
    Metric("nll_delta", "nll minus native nll on the same samples", _M + "nll_delta", False),
    Metric("accuracy", "teacher-forced next-token accuracy on the continuation", _M + "accuracy", True),
    Metric("kl_mean", "mean KL(native || x) over continuation positions (nats)", _M + "kl_mean", False),
    Metric("kl_p95", "95th percentile of KL(native || x) over continuation positions", _M + "kl_p95", False),
    Metric("top1_agreement", "share of positions whose argmax equals native's", _M + "top1_agreement", True),
    Metric("topk_overlap", "mean |top-k(x) & top-k(native)| / k", _M + "topk_overlap", True),
    Metric("tv_top_p", "total-variation distance after top-p truncation", _M + "tv_top_p", False),
    Metric("max_abs_logit_diff", "max |logit_x - logit_native|", _M + "max_abs_logit_diff", False),
    Metric("gap_recovered", "(NLL_no_prefix - NLL_x) / (NLL_no_prefix - NLL_native)", _M + "gap_recovered", True),
    Metric("retention", "acc_x / acc_native (the papers' retention; overstates benefit)", _M + "retention", True),
    Metric("retention_floor", "(acc_x - acc_no_prefix) / (acc_native - acc_no_prefix)", _M + "retention_floor", True),
    Metric("greedy_first_divergence", "mean first greedy step that leaves native's tokens (G if none)",
           _M + "greedy_first_divergence", True),
    Metric("greedy_agreement", "greedy tokens matching native before the first divergence / G",
           _M + "greedy_agreement", True),
    Metric("attention_cosine_mean", "attention-output cosine vs native prefix K/V, mean over target layers",
           _M + "attention_cosine_mean", True),
    Metric("attention_cosine_min", "attention-output cosine vs native prefix K/V, min over target layers",
           _M + "attention_cosine_min", True),
)


@hookimpl
def kvbridge_register_metrics(register):
    for metric in METRICS:
        register(metric)
