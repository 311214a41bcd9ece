"""Quality/cost curves of selective recompute on a transferred cache (``kvbridge eval --recompute-*``).

On the same held-out samples as ``kvbridge eval``: ``native`` (the target's prefill, ceiling),
``transferred`` (0% recomputed), ``no_prefix`` (floor), and one condition per point of the dial:

- ``layers@K``: K layers recomputed (named, or chosen on calibration samples by the greedy group
  search / the single-layer profile; a sweep takes the greedy search's nested sets); ``prefix@K``:
  layers ``0..K-1`` (the cheapest K layers when the target's own forward feeds them);
- ``tokens@R``: the CacheBlend rule on the transferred prefix (``exact_len = 0``): layers 0..1 of
  the target on every prefix token, then the R of tokens whose K/V deviate most; ``last@R`` (with
  ``token_rules`` naming ``"last"``): the same cost with the prefix's last R tokens instead.

Each point carries its measured cost: FLOPs (counted from the weights, :mod:`~kvbridge.recompute.cost`)
and wall time, both relative to the target's full prefill of the same prefixes measured in the
same run. ``gap_recovered`` has paired bootstrap intervals; ``deficit_closed`` is the share of
the plain transfer's deficit to native that the recompute wins back.
"""

from __future__ import annotations

from functools import partial

from kvbridge.evaluate.fields import summarize_fields
from kvbridge.evaluate.runner import Built, Condition, Prefills, sample_ids
from kvbridge.progress import json_ready
from kvbridge.recompute.cost import prefill_flops
from kvbridge.recompute.layers import budget_count, capture_hidden, choose_layers, layer_sets, recompute_layers
from kvbridge.recompute.settings import RecomputeError
from kvbridge.recompute.tokens import RULES, blend

SCHEMA = "kvbridge-recompute-curve/1"
TOKEN_SWEEP = (0.05, 0.1, 0.15, 0.3, 0.5, 1.0)


def layer_points(spec, model, calib=None, *, method: str = "greedy", group_size: int = 1, host=None):
    """``[(name, layers, info)]`` for one layer spec (``"3,7-9"``, ``"auto:15%"``)."""
    layers, info = choose_layers(spec, model, calib, method=method, group_size=group_size, host=host)
    tag = "prefix" if method == "prefix" and info.get("method") == "prefix" else "layers"
    return [(f"{tag}@{len(layers)}", tuple(layers), info)]


def layer_sweep(model, calib, *, max_share: float = 0.5, method: str = "greedy", group_size: int = 1, host=None):
    """Nested layer sets from 0 up to ``max_share`` of the layers, then all of them."""
    n = model.config.num_hidden_layers
    k = max(1, budget_count(max_share, n))
    sets, measured = layer_sets(model, calib, k, method=method, group_size=group_size, host=host)
    info = {"method": method if method in ("prefix", "profile") else "greedy", **measured}
    tag = "prefix" if method == "prefix" else "layers"
    points = [(f"{tag}@{len(s)}", s, info) for s in sets]
    if not points or len(points[-1][1]) < n:
        points.append((f"{tag}@{n}", tuple(range(n)), info))
    return points


def run_curve(run, mapping, samples, plan, *, progress=None) -> dict:
    """Every point of ``plan`` (a :class:`~kvbridge.recompute.settings.CurvePlan`) on the same samples;
    JSON-ready (see the module docstring). ``run``: a :class:`~kvbridge.run.Run` whose settings (an
    :class:`~kvbridge.evaluate.settings.EvalSettings`) give ``prefix_len``, ``continuation_len``,
    ``batch_size``, ``attention``, ``bootstrap``, ``seed`` and ``recompute.mode``."""
    s = run.settings
    source, target, mode, bootstrap, seed = run.source.model, run.target.model, s.recompute.mode, s.bootstrap, s.seed
    token_rules, check_layer = tuple(plan.token_rules), plan.check_layer
    hook = partial(capture_hidden, source) if mode == "source" else None
    pre = Prefills(source, target, mapping, host=run.host, source_hook=hook)
    samples, p, c = sample_ids(samples, s.prefix_len, s.continuation_len, RecomputeError)
    points = [(name, "layers", layers) for name, layers, _ in plan.layer_points]
    bad = [x for x in token_rules if x not in RULES]  # before any prefill (a plan built in Python)
    if bad:
        raise RecomputeError(f"unknown token rule {bad[0]!r}", f"use one of {', '.join(RULES)}")
    points += [
        (f"{'tokens' if rule == 'deviation' else rule}@{r:g}", rule, float(r))
        for rule in token_rules
        for r in plan.token_ratios
        if r > 0
    ]
    if not points:
        raise RecomputeError(
            "no recompute point to run", "pass --recompute-layers, --recompute-tokens or --recompute-sweep"
        )
    n = samples.shape[0]
    warm = samples[:1, :p]  # one untimed pass of each code path: first calls allocate and dispatch slowly
    pre.tad.extract(target, warm, spec=pre.tspec)
    blend(target, pre.tad.extract(target, warm, spec=pre.tspec), 0, 0.5, check_layer=check_layer)

    def point(kind, arg, bt):
        if kind == "layers":
            hidden = pre.source_state(bt, extra=True)
            st, cst = recompute_layers(target, pre.transferred(bt), arg, mode=mode, source_hidden=hidden)
        else:
            res = blend(target, pre.transferred(bt), 0, arg, check_layer=check_layer, rule=kind)
            st, cst = res.state, res.cost
        return Built(st, seconds=cst.seconds, flops=cst.flops)

    conds = pre.conditions("native", "transferred")
    conds += [Condition(name, partial(point, kind, arg)) for name, kind, arg in points] + pre.conditions("no_prefix")
    fields, cost = pre.run(conds, samples, p, c, s.batch_size, attention=s.attention, progress=progress)
    t_native, t_transfer = pre.timing["target_prefill_s"], pre.timing["transfer_s"]
    summary = summarize_fields(fields, bootstrap=bootstrap, seed=seed, reference="transferred")
    full_flops = prefill_flops(target, p, batch=n)
    nl = pre.tspec.num_layers
    layers_of = {name: arg for name, kind, arg in points if kind == "layers"}
    for cond, row in summary["conditions"].items():
        row["recompute_flop_share"] = cost[cond]["flops"] / full_flops if cond != "native" else 1.0
        row["time_share"] = (cost[cond]["seconds"] / t_native if t_native > 0 else None) if cond != "native" else 1.0
        if cond in layers_of:
            row["layers"] = list(layers_of[cond])
            row["share"] = len(layers_of[cond]) / nl
        elif cond.split("@")[0] in ("tokens", *token_rules):
            row["share"] = float(cond.split("@")[1])
        elif cond == "transferred":
            row["share"] = 0.0
    result = {
        "schema": SCHEMA,
        "mode": mode,
        "samples": n,
        "prefix_len": p,
        "continuation_len": c,
        "target_layers": nl,
        "bootstrap": bootstrap,
        "seed": seed,
        "check_layer": check_layer,
        "conditions": summary["conditions"],
        "timing": {
            "target_prefill_ms": 1e3 * t_native,
            "transfer_ms": 1e3 * t_transfer,
            "full_prefill_flops": full_flops,
        },
        "notes": [
            "time_share = recompute wall time / the target's full prefill of the same prefixes (this run, "
            "this machine); recompute_flop_share counts linear maps and attention from the weights",
            "mode target: a recomputed layer set costs the target's forward up to its last layer; "
            "mode source: only the recomputed layers run, on the source's hidden states",
        ],
    }
    return json_ready(result, stringify=False)
