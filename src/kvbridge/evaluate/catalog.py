"""The built-in metrics, listed once (torch-free): name, description, direction, table column.

This one list feeds the built-in metrics plugin (:mod:`kvbridge.builtin.metrics` registers a
:class:`~kvbridge.plugin_types.Metric` per entry), the report order
(:func:`kvbridge.evaluate.metrics.resolve_metrics`), the terminal table's columns
(:data:`kvbridge.evaluate.report.COLUMNS`) and the ``kvbridge eval --help`` text. Each
entry's function is the one of the same name in :mod:`kvbridge.evaluate.metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricInfo:
    name: str
    description: str
    higher_is_better: bool
    column: str = ""  # header in the terminal table ("" = not a column)
    fmt: str = "{:.3f}"

    @property
    def factory(self) -> str:
        return f"kvbridge.evaluate.metrics:{self.name}"


BUILTIN_METRICS = (
    MetricInfo("nll", "mean continuation negative log-likelihood (nats/token)", False, "nll", "{:.3f}"),
    MetricInfo("perplexity", "exp(nll) of the continuation", False, "ppl", "{:.1f}"),
    MetricInfo("nll_delta", "nll minus native nll on the same samples", False),
    MetricInfo("accuracy", "teacher-forced next-token accuracy on the continuation", True),
    MetricInfo("kl_mean", "mean KL(native || x) over continuation positions (nats)", False, "kl_mean", "{:.4f}"),
    MetricInfo("kl_p95", "95th percentile of KL(native || x) over continuation positions", False, "kl_p95", "{:.4f}"),
    MetricInfo("top1_agreement", "share of positions whose argmax equals native's", True, "top1"),
    MetricInfo("topk_overlap", "mean |top-k(x) & top-k(native)| / k", True, "topk"),
    MetricInfo("tv_top_p", "total-variation distance after top-p truncation", False, "tv_p"),
    MetricInfo("max_abs_logit_diff", "max |logit_x - logit_native|", False),
    MetricInfo("gap_recovered", "(NLL_no_prefix - NLL_x) / (NLL_no_prefix - NLL_native)", True, "gap_rec", "{:+.3f}"),
    MetricInfo("retention", "acc_x / acc_native (the papers' retention; overstates benefit)", True, "retain"),
    MetricInfo("retention_floor", "(acc_x - acc_no_prefix) / (acc_native - acc_no_prefix)", True),
    MetricInfo("greedy_first_divergence", "mean first greedy step that leaves native's tokens (G if none)", True),
    MetricInfo("greedy_agreement", "greedy tokens matching native before the first divergence / G", True, "greedy"),
    MetricInfo(
        "attention_cosine_mean",
        "attention-output cosine vs native prefix K/V, mean over target layers",
        True,
        "cos_mean",
    ),
    MetricInfo(
        "attention_cosine_min", "attention-output cosine vs native prefix K/V, min over target layers", True, "cos_min"
    ),
)

#: the built-in metric names, in report order
NAMES = tuple(m.name for m in BUILTIN_METRICS)


def help_text() -> str:
    """One line per built-in metric, for ``kvbridge eval --help``."""
    return "\n".join(f"  {m.name}: {m.description}" for m in BUILTIN_METRICS)
