"""Quality metrics of a condition against ``native``, with paired bootstrap intervals.

A metric is a plugin (:class:`kvbridge.plugin_types.Metric`, registered through
``kvbridge_register_metrics``) whose factory loads a function ``metric(view)``. ``view`` is an
:class:`EvalView`: one condition's per-sample arrays with a leading *replicate* dimension
``R`` (``R = 1`` for the point estimate, one row per bootstrap resample otherwise), so every
field below is really ``[R, N, ...]``. A metric returns ``R`` values (a tensor), reducing over
everything else; a metric that can only return one number is called once per replicate.
It returns ``nan`` where it does not apply (e.g. attention cosine for ``no_prefix``).

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

from dataclasses import dataclass, field

import torch

from kvbridge.errors import KVBridgeError
from kvbridge.evaluate.catalog import NAMES

NAN = float("nan")


@dataclass
class EvalView:
    """One condition's per-sample arrays for ``R`` sample draws at once (see the module docstring).

    Every field has a leading *replicate* dimension: ``[R, N, ...]``. The point estimate is a
    view with ``R = 1`` (the samples as they are); bootstrap views have one row per resample.
    A metric reduces over everything but that dimension and returns ``R`` values.
    """

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
    def replicates(self) -> int:
        return int(next(iter(self.fields.values())).shape[0])

    @classmethod
    def of(cls, condition: str, fields: dict, params: dict | None = None) -> "EvalView":
        """The point-estimate view (``R = 1``) of per-sample ``fields`` ``[N, ...]``."""
        return cls(condition, {k: v[None] for k, v in fields.items()}, dict(params or {}))

    @classmethod
    def resampled(cls, condition: str, fields: dict, idx: torch.Tensor, params: dict | None = None) -> "EvalView":
        """Bootstrap views: ``idx [R, N]`` sample indices (the same for every condition: paired)."""
        return cls(condition, {k: v[idx] for k, v in fields.items()}, dict(params or {}))

    def replicate(self, r: int) -> "EvalView":
        return EvalView(self.condition, {k: v[r : r + 1] for k, v in self.fields.items()}, self.params)


def _nan(view: EvalView) -> torch.Tensor:
    return torch.full((view.replicates,), NAN, dtype=torch.float64)


def _over(view: EvalView, name: str, reduce=lambda t: t.mean(1)) -> torch.Tensor:
    """Per replicate mean over samples and positions (samples weigh equally: same C each), or another
    ``reduce`` of the ``[R, N x ...]`` float64 values; nan where the field is absent or empty."""
    t = view.get(name)
    return _nan(view) if t is None or t[0].numel() == 0 else reduce(t.double().flatten(1))


# -- the built-in metrics (each returns a [R] tensor) -------------------------------------------------
def nll(view: EvalView):
    """Mean continuation negative log-likelihood (nats per token)."""
    return _over(view, "nll")


def perplexity(view: EvalView):
    """exp(nll) of the continuation."""
    return nll(view).exp()


def nll_delta(view: EvalView):
    """nll − native nll on the same samples (0 = native quality)."""
    return nll(view) - _over(view, "native_nll")


def accuracy(view: EvalView):
    """Teacher-forced next-token accuracy on the continuation (argmax == true token)."""
    return _over(view, "correct")


def kl_mean(view: EvalView):
    """Mean over continuation positions of KL(native ‖ x) (nats)."""
    return _over(view, "kl")


def kl_p95(view: EvalView):
    """95th percentile over continuation positions of KL(native ‖ x) (nats)."""
    return _over(view, "kl", lambda t: torch.quantile(t, 0.95, dim=1))


def top1_agreement(view: EvalView):
    """Share of continuation positions where x's argmax equals native's."""
    return _over(view, "top1")


def topk_overlap(view: EvalView):
    """Mean |top-k(x) ∩ top-k(native)| / k (k = ``--top-k``, default 5)."""
    return _over(view, "topk")


def tv_top_p(view: EvalView):
    """Mean total-variation distance of the top-p (default 0.9) truncated distributions."""
    return _over(view, "tv")


def max_abs_logit_diff(view: EvalView):
    """Max |logit_x − logit_native| over samples, positions and vocabulary."""
    return _over(view, "max_abs_logit_diff", lambda t: t.max(1).values)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 1e-9, num / den.clamp_min(1e-9), torch.full_like(num, NAN))


def gap_recovered(view: EvalView):
    """(NLL_no_prefix − NLL_x) / (NLL_no_prefix − NLL_native) on mean NLLs (nan without a no_prefix run)."""
    floor, ceil = _over(view, "no_prefix_nll"), _over(view, "native_nll")
    return _ratio(floor - nll(view), floor - ceil)


def retention(view: EvalView):
    """acc_x / acc_native (next-token accuracy; the papers' retention; overstates benefit)."""
    return _ratio(accuracy(view), _over(view, "native_correct"))


def retention_floor(view: EvalView):
    """(acc_x − acc_no_prefix) / (acc_native − acc_no_prefix): floor-normalised retention (nan without no_prefix)."""
    floor, ceil = _over(view, "no_prefix_correct"), _over(view, "native_correct")
    return _ratio(accuracy(view) - floor, ceil - floor)


def greedy_first_divergence(view: EvalView):
    """Mean first greedy step where x's tokens leave native's (G when they never do)."""
    return _over(view, "greedy_div")


def greedy_agreement(view: EvalView):
    """Mean share of the G greedy tokens generated before the first divergence from native."""
    return greedy_first_divergence(view) / (view.params.get("greedy_tokens") or 1)


def layer_cosines(view: EvalView):
    """``[R, L]`` sample-mean attention-output cosine per target layer, or None."""
    t = view.get("attn_cos")
    return None if t is None or t[0].numel() == 0 else t.double().mean(dim=1)


def attention_cosine_mean(view: EvalView):
    """Mean over target layers of the attention-output cosine (native vs this prefix K/V)."""
    t = layer_cosines(view)
    return _nan(view) if t is None else t.mean(-1)


def attention_cosine_min(view: EvalView):
    """Minimum over target layers of the (sample-mean) attention-output cosine."""
    t = layer_cosines(view)
    return _nan(view) if t is None else t.min(-1).values


# -- resolving and summarising -----------------------------------------------------------------------
class MetricError(KVBridgeError):
    """A metric raised, or returned something that is not one number per replicate."""


@dataclass(frozen=True)
class LoadedMetric:
    name: str
    fn: object
    higher_is_better: bool
    description: str = ""
    plugin: str = ""  # the plugin that registered it (named in its errors)


def resolve_metrics(host=None, names=None) -> list[LoadedMetric]:
    """The metrics ``names`` (default: every registered one) loaded through ``host.get``, built-ins in
    catalog order, then the others by name."""
    from kvbridge.errors import PluginError
    from kvbridge.plugins import host_or_default

    host = host_or_default(host)
    wanted = host.names("metric") if names is None else list(names)
    if not wanted and names is None:
        raise PluginError(
            "no metrics are registered",
            "enable the built-in metrics plugin (kvbridge.builtin.metrics) or a metrics plugin",
        )
    out = []
    for name in wanted:
        m, fn = host.entry("metric", name), host.get("metric", name)
        out.append(LoadedMetric(m.name, fn, bool(m.higher_is_better), m.description, host.owner("metric", name)))
    order = {n: i for i, n in enumerate(NAMES)}  # the built-ins' report order (kvbridge.evaluate.catalog)
    return sorted(out, key=lambda m: (order.get(m.name, len(order)), m.name))


def _failed(metric, what: str) -> MetricError:
    plugin = getattr(metric, "plugin", "") or "?"
    return MetricError(
        f"metric {metric.name!r} (plugin {plugin!r}) {what}",
        f"fix the metric, or leave it out (disable its plugin: KVBRIDGE_DISABLE_PLUGINS={plugin})",
    )


def _values(metric, view: EvalView) -> torch.Tensor:
    """``[R]`` float64 values of a metric; a metric that returns one number is called per replicate.

    A metric returns ``nan`` where it does not apply; an exception inside it (a misspelt
    field, a bug) is a :class:`MetricError` naming the metric and its plugin.
    """
    fn = metric.fn
    try:
        t = torch.as_tensor(fn(view), dtype=torch.float64).flatten()
        if t.numel() == view.replicates:
            return t
        if t.numel() == 1 and view.replicates > 1:
            each = (torch.as_tensor(fn(view.replicate(r)), dtype=torch.float64) for r in range(view.replicates))
            return torch.tensor([float(x.flatten()[0]) for x in each], dtype=torch.float64)
    except KVBridgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - any bug in a plugin's metric
        detail = " ".join(str(exc).split())[:200]
        raise _failed(metric, f"failed on condition {view.condition!r}: {type(exc).__name__}: {detail}") from exc
    raise _failed(metric, f"returned {t.numel()} values for {view.replicates} replicates (want one per replicate)")


def bootstrap_indices(n: int, replicates: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, n, (int(replicates), n), generator=g)


def percentile_interval(values: torch.Tensor) -> list:
    """The 95% percentile interval of bootstrap replicates ([nan, nan] when mostly undefined)."""
    t = values.double().flatten()
    t = t[~torch.isnan(t)]
    if t.numel() < max(2, values.numel() // 2):  # mostly undefined: no interval
        return [NAN, NAN]
    return torch.quantile(t, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()


def summarize(
    run, metrics: list[LoadedMetric] | None = None, *, bootstrap: int = 1000, seed: int = 0, host=None, block: int = 250
) -> dict:
    """``{"conditions": {cond: {metric: v, metric_ci: [lo, hi], ...}}, "comparisons": {...}}``.

    ``bootstrap`` paired resamples (the same sample indices for every condition), processed
    ``block`` replicates at a time.
    """
    metrics = metrics if metrics is not None else resolve_metrics(host)
    params = {"greedy_tokens": run.config.greedy_tokens, "top_k": run.config.top_k, "top_p": run.config.top_p}
    fields = run.fields
    idx = bootstrap_indices(run.num_samples, bootstrap, seed) if bootstrap > 0 else None
    reps = {c: {m.name: [] for m in metrics} for c in fields}
    layer_reps = {c: [] for c in fields}
    nll_reps = {c: [] for c in fields}
    if idx is not None:
        for start in range(0, idx.shape[0], block):
            sel = idx[start : start + block]
            for c, f in fields.items():
                view = EvalView.resampled(c, f, sel, params)
                for m in metrics:
                    reps[c][m.name].append(_values(m, view))
                lc = layer_cosines(view)
                if lc is not None:
                    layer_reps[c].append(lc)
                nll_reps[c].append(nll(view))
    out: dict = {}
    point_nll = {}
    for c, f in fields.items():
        view = EvalView.of(c, f, params)
        row: dict = {}
        for m in metrics:
            row[m.name] = float(_values(m, view)[0])
            row[f"{m.name}_ci"] = percentile_interval(torch.cat(reps[c][m.name])) if idx is not None else [NAN, NAN]
        lc = layer_cosines(view)
        if lc is not None:
            row["attention_cosine_layers"] = [float(x) for x in lc[0]]
            if layer_reps[c]:
                q = torch.quantile(torch.cat(layer_reps[c]), torch.tensor([0.025, 0.975], dtype=torch.float64), dim=0)
                row["attention_cosine_layers_ci"] = [[float(a), float(b)] for a, b in zip(q[0], q[1])]
        point_nll[c] = float(nll(view)[0])
        out[c] = row
    t_reps = torch.cat(nll_reps["transferred"]) if idx is not None and "transferred" in fields else None
    comparisons = {
        f"transferred_vs_{c}": {
            "nll_diff": point_nll["transferred"] - point_nll[c],
            "nll_diff_ci": percentile_interval(t_reps - torch.cat(nll_reps[c])) if idx is not None else [NAN, NAN],
        }
        for c in fields
        if c != "transferred" and "transferred" in fields
    }
    return {
        "conditions": out,
        "comparisons": comparisons,
        "higher_is_better": {m.name: m.higher_is_better for m in metrics},
        "descriptions": {m.name: m.description for m in metrics},
    }
