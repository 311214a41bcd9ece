"""Quality metrics of a condition against ``native``, with paired bootstrap intervals.

A metric is a plugin (:class:`kvbridge.plugin_types.Metric`, registered through
``kvbridge_register_metrics``) whose factory loads a function ``metric(view) -> float``.
``view`` is an :class:`EvalView`: one condition's per-sample arrays (leading dimension = the
samples), restricted to a bootstrap resample when intervals are computed. A metric returns
``nan`` where it does not apply (e.g. attention cosine for ``no_prefix``).

Fields of a view (``C`` = scored continuation positions, ``L`` = target layers):

========================  =========  ==========================================================
``nll``                   [N, C]     −log p(true next token)
``correct``               [N, C]     1 where the argmax is the true next token
``kl``                    [N, C]     KL(native ‖ x) of the next-token distributions (nats)
``top1``                  [N, C]     1 where the argmax equals native's argmax
``topk``                  [N, C]     |top-k(x) ∩ top-k(native)| / k
``tv``                    [N, C]     total variation between the top-p truncated, renormalised
                                     distributions of x and native
``max_abs_logit_diff``    [N]        max |logit_x − logit_native| over positions and vocabulary
``greedy_div``            [N]        first greedy step (of G) where x's tokens leave native's;
                                     G when they never do
``attn_cos``              [N, L]     attention-output cosine per target layer (see
                                     :mod:`kvbridge.evaluate.conditions`); absent without a cache
``native_nll``,           [N, C]     the same samples' native / no-prefix values (paired
``no_prefix_nll``, ...               references for gap_recovered and retention)
========================  =========  ==========================================================

Definitions of the built-in metrics (the docstrings are the reference):

- ``gap_recovered = (NLL_no_prefix − NLL_x) / (NLL_no_prefix − NLL_native)`` on mean NLLs:
  1 = as good as the native cache, 0 = no better than no prefix, < 0 worse than no prefix;
  nan when native is not better than no prefix on these samples.
- ``retention = acc_x / acc_native`` where acc is teacher-forced next-token accuracy on the
  continuation: the papers' "transfer score / target score". It overstates the benefit (a
  model with *no* prefix already keeps most of the accuracy), so ``retention_floor`` =
  ``(acc_x − acc_no_prefix) / (acc_native − acc_no_prefix)`` and ``gap_recovered`` are reported
  next to it.

Intervals: a paired bootstrap over samples: each replicate draws N sample indices with
replacement, *the same indices for every condition*, recomputes every metric, and the 95%
interval is the 2.5th..97.5th percentile of the replicates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

NAN = float("nan")


@dataclass
class EvalView:
    """One condition's per-sample arrays (see the module docstring)."""

    condition: str
    fields: dict
    params: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.fields[name]

    def __contains__(self, name: str) -> bool:
        return name in self.fields

    def get(self, name: str, default=None):
        return self.fields.get(name, default)

    @property
    def num_samples(self) -> int:
        return int(next(iter(self.fields.values())).shape[0])

    def select(self, idx: torch.Tensor) -> "EvalView":
        return EvalView(self.condition, {k: v.index_select(0, idx) for k, v in self.fields.items()}, self.params)


def _mean(view: EvalView, name: str) -> float:
    t = view.get(name)
    if t is None or t.numel() == 0:
        return NAN
    return float(t.mean())


# -- the built-in metrics ---------------------------------------------------------------------------
def nll(view: EvalView) -> float:
    """Mean continuation negative log-likelihood (nats per token)."""
    return _mean(view, "nll")


def perplexity(view: EvalView) -> float:
    """exp(nll) of the continuation."""
    v = nll(view)
    return math.exp(v) if v == v else NAN


def nll_delta(view: EvalView) -> float:
    """nll − native nll on the same samples (0 = native quality)."""
    return nll(view) - _mean(view, "native_nll")


def accuracy(view: EvalView) -> float:
    """Teacher-forced next-token accuracy on the continuation (argmax == true token)."""
    return _mean(view, "correct")


def kl_mean(view: EvalView) -> float:
    """Mean over continuation positions of KL(native ‖ x) (nats)."""
    return _mean(view, "kl")


def kl_p95(view: EvalView) -> float:
    """95th percentile over continuation positions of KL(native ‖ x) (nats)."""
    t = view.get("kl")
    if t is None or t.numel() == 0 or bool(torch.isnan(t).any()):
        return NAN
    return float(torch.quantile(t.flatten().double(), 0.95))


def top1_agreement(view: EvalView) -> float:
    """Share of continuation positions where x's argmax equals native's."""
    return _mean(view, "top1")


def topk_overlap(view: EvalView) -> float:
    """Mean |top-k(x) ∩ top-k(native)| / k (k = ``--top-k``, default 5)."""
    return _mean(view, "topk")


def tv_top_p(view: EvalView) -> float:
    """Mean total-variation distance of the top-p (default 0.9) truncated distributions."""
    return _mean(view, "tv")


def max_abs_logit_diff(view: EvalView) -> float:
    """Max |logit_x − logit_native| over samples, positions and vocabulary."""
    t = view.get("max_abs_logit_diff")
    return NAN if t is None or t.numel() == 0 else float(t.max())


def gap_recovered(view: EvalView) -> float:
    """(NLL_no_prefix − NLL_x) / (NLL_no_prefix − NLL_native) on mean NLLs."""
    if "no_prefix_nll" not in view:
        return NAN
    floor, ceil, x = _mean(view, "no_prefix_nll"), _mean(view, "native_nll"), nll(view)
    den = floor - ceil
    if not den > 1e-9:
        return NAN
    return (floor - x) / den


def retention(view: EvalView) -> float:
    """acc_x / acc_native (next-token accuracy; the papers' retention; overstates benefit)."""
    den = _mean(view, "native_correct")
    return accuracy(view) / den if den > 0 else NAN


def retention_floor(view: EvalView) -> float:
    """(acc_x − acc_no_prefix) / (acc_native − acc_no_prefix): floor-normalised retention."""
    if "no_prefix_correct" not in view:
        return NAN
    floor, ceil = _mean(view, "no_prefix_correct"), _mean(view, "native_correct")
    den = ceil - floor
    return (accuracy(view) - floor) / den if den > 1e-9 else NAN


def greedy_first_divergence(view: EvalView) -> float:
    """Mean first greedy step where x's tokens leave native's (G when they never do)."""
    return _mean(view, "greedy_div")


def greedy_agreement(view: EvalView) -> float:
    """Mean share of the G greedy tokens generated before the first divergence from native."""
    g = view.params.get("greedy_tokens") or 1
    return greedy_first_divergence(view) / g


def _layer_cos(view: EvalView):
    t = view.get("attn_cos")
    return None if t is None or t.numel() == 0 else t.mean(dim=0)


def attention_cosine_mean(view: EvalView) -> float:
    """Mean over target layers of the attention-output cosine (native vs this prefix K/V)."""
    t = _layer_cos(view)
    return NAN if t is None else float(t.mean())


def attention_cosine_min(view: EvalView) -> float:
    """Minimum over target layers of the (sample-mean) attention-output cosine."""
    t = _layer_cos(view)
    return NAN if t is None else float(t.min())


#: the built-in metrics in report order (registered by :mod:`kvbridge.builtin.metrics`)
BUILTIN = ("nll", "perplexity", "nll_delta", "accuracy", "kl_mean", "kl_p95", "top1_agreement", "topk_overlap",
           "tv_top_p", "max_abs_logit_diff", "gap_recovered", "retention", "retention_floor",
           "greedy_first_divergence", "greedy_agreement", "attention_cosine_mean", "attention_cosine_min")


# -- resolving and summarising -----------------------------------------------------------------------
@dataclass(frozen=True)
class LoadedMetric:
    name: str
    fn: object
    higher_is_better: bool
    description: str = ""


def resolve_metrics(host=None, names=None) -> list[LoadedMetric]:
    """The metrics registered with the host (the built-in plugin's when the host lacks it)."""
    from kvbridge.plugins import get_host

    host = host or get_host()
    reg = host.registry("metric")
    items = dict(reg.items)
    if not any(n in items for n in BUILTIN):  # a host built without the built-in metrics plugin
        from kvbridge.builtin.metrics import METRICS

        items.update({m.name: m for m in METRICS if m.name not in items})
    wanted = list(items) if names is None else list(names)
    out = []
    for name in wanted:
        if name not in items:
            from kvbridge.errors import PluginError

            raise PluginError(f"unknown metric {name!r}", f"available: {', '.join(sorted(items))}")
        m = items[name]
        out.append(LoadedMetric(m.name, m.load(), bool(m.higher_is_better), m.description))
    order = {n: i for i, n in enumerate(BUILTIN)}
    return sorted(out, key=lambda m: (order.get(m.name, len(order)), m.name))


def _safe(fn, view) -> float:
    try:
        v = float(fn(view))
    except (KeyError, ZeroDivisionError, RuntimeError, ValueError):
        return NAN
    return v


def bootstrap_indices(n: int, replicates: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, n, (int(replicates), n), generator=g)


def _interval(values: list[float]) -> list:
    t = torch.tensor([v for v in values if v == v], dtype=torch.float64)
    if t.numel() < max(2, len(values) // 2):
        return [NAN, NAN]
    lo, hi = torch.quantile(t, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return [lo, hi]


def summarize(run, metrics: list[LoadedMetric] | None = None, *, bootstrap: int = 1000, seed: int = 0,
              host=None) -> dict:
    """``{"conditions": {cond: {metric: v, metric_ci: [lo, hi], ...}}, "comparisons": {...}}``."""
    metrics = metrics if metrics is not None else resolve_metrics(host)
    params = {"greedy_tokens": run.config.greedy_tokens, "top_k": run.config.top_k, "top_p": run.config.top_p}
    views = {c: EvalView(c, f, params) for c, f in run.fields.items()}
    n = run.num_samples
    idx = bootstrap_indices(n, bootstrap, seed) if bootstrap > 0 else torch.empty(0, n, dtype=torch.long)
    out: dict = {}
    reps: dict = {c: {m.name: [] for m in metrics} for c in views}
    layer_reps: dict = {c: [] for c in views}
    diff_reps: dict = {c: [] for c in views}
    for b in range(idx.shape[0]):
        sel = idx[b]
        sub_t = views["transferred"].select(sel) if "transferred" in views else None
        for c, view in views.items():
            sub = view.select(sel)
            for m in metrics:
                reps[c][m.name].append(_safe(m.fn, sub))
            lc = _layer_cos(sub)
            if lc is not None:
                layer_reps[c].append(lc)
            if sub_t is not None:
                diff_reps[c].append(nll(sub_t) - nll(sub))
    for c, view in views.items():
        row: dict = {}
        for m in metrics:
            row[m.name] = _safe(m.fn, view)
            row[f"{m.name}_ci"] = _interval(reps[c][m.name]) if idx.shape[0] else [NAN, NAN]
        lc = _layer_cos(view)
        if lc is not None:
            row["attention_cosine_layers"] = [float(x) for x in lc]
            if layer_reps[c]:
                stack = torch.stack(layer_reps[c]).double()
                q = torch.quantile(stack, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=0)
                row["attention_cosine_layers_ci"] = [[float(a), float(b)] for a, b in zip(q[0], q[1])]
        out[c] = row
    comparisons = {}
    if "transferred" in views:
        t_nll = nll(views["transferred"])
        for c, view in views.items():
            if c == "transferred":
                continue
            comparisons[f"transferred_vs_{c}"] = {
                "nll_diff": t_nll - nll(view),
                "nll_diff_ci": _interval(diff_reps[c]) if idx.shape[0] else [NAN, NAN],
            }
    return {"conditions": out, "comparisons": comparisons,
            "higher_is_better": {m.name: m.higher_is_better for m in metrics},
            "descriptions": {m.name: m.description for m in metrics}}


__all__ = ["EvalView", "LoadedMetric", "resolve_metrics", "summarize", "bootstrap_indices", "BUILTIN",
           *BUILTIN]
