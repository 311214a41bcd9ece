"""The recompute condition sets of ``kvbridge eval``: ``--recompute-*`` (the curve) and ``--frontier``.

They register with the eval stage's runner as :class:`~kvbridge.evaluate.run.ConditionSet` values
(:data:`CONDITION_SETS`): ``evaluate/`` never imports this stage; :func:`evaluate_pair` /
:func:`evaluate_run` here are ``kvbridge eval`` with them (what the CLI and ``kvbridge.api`` call).
"""

from __future__ import annotations

import torch

from kvbridge.evaluate import windows
from kvbridge.evaluate.run import ConditionSet
from kvbridge.recompute import curve, frontier, frontier_report, report
from kvbridge.recompute.layers import calibration, parse_layers
from kvbridge.recompute.settings import CurvePlan, parse_ratio, split_list


def curve_plan(run, texts, mapping) -> tuple[CurvePlan, bool]:
    """The points ``run.settings.recompute`` asks, and whether a layer choice was calibrated (on the
    corpus front: the first half of its first 90%)."""
    s, r = run.settings, run.settings.recompute
    smodel, tmodel = run.source.model, run.target.model
    # one point per ';'-separated spec ("3,7-9" is one set of layers)
    layer_specs = [x.strip() for x in r.layers.split(";") if x.strip()] if r.layers else []
    ratios = [parse_ratio(x) for x in split_list(r.tokens)] if r.tokens else []
    if r.sweep in ("tokens", "both"):
        ratios = sorted(set(ratios) | set(curve.TOKEN_SWEEP))
    parsed = [parse_layers(x, tmodel.config.num_hidden_layers) for x in layer_specs]  # fail early on a typo
    calib = None
    if r.sweep in ("layers", "both") or any(p and p[0] == "auto" for p in parsed):
        front = "\n".join(texts)
        front = front[: int(len(front) * 0.9)]
        stream = torch.tensor(run.target.tokenizer(front, add_special_tokens=False)["input_ids"], dtype=torch.long)
        cal = windows(stream[: len(stream) // 2], r.calibration_samples, s.sample_len)
        calib = calibration(smodel, tmodel, mapping, cal, s.prefix_len, s.continuation_len, batch_size=s.batch_size)
    points = []
    for spec in layer_specs:
        points += curve.layer_points(spec, tmodel, calib, method=r.select, group_size=r.group)
    if r.sweep in ("layers", "both"):
        points += curve.layer_sweep(tmodel, calib, method=r.select, group_size=r.group)
    uniq: dict = {}  # one point per layer set, the first named
    for p in points:
        uniq.setdefault(p[1], p)
    return CurvePlan(tuple(uniq.values()), tuple(ratios), tuple(r.rules)), calib is not None


def eval_recompute(run, mapping, ids, inputs, progress=None) -> tuple[dict, dict]:
    """``kvbridge eval --recompute-*`` on ``run``: ``(result, written files)``."""
    s = run.settings
    plan, calibrated = curve_plan(run, inputs["texts"], mapping)
    result = curve.run_curve(run, mapping, ids, plan, progress=progress)
    if calibrated:
        result["selection"] = dict(next((p[2] for p in plan.layer_points if p[2].get("method") != "named"), {}))
        result["calibration"] = {
            "samples": s.recompute.calibration_samples,
            "source": "the corpus's front (first half of the first 90%), never the evaluation tail",
        }
    return result, report.write(result, s.report_dir, "recompute_curve", "selective recompute") if s.report_dir else {}


def eval_frontier(run, mapping, ids, inputs, progress=None) -> tuple[dict, dict]:
    """``kvbridge eval --frontier`` on ``run``: ``(result, written files)``."""
    result = frontier.run_frontier(run, mapping, ids, progress=progress)
    result.update(source=inputs["source"], target=inputs["target"], mapping=run.settings.mapping, data=inputs["data"])
    return result, frontier_report.write(result, run.settings.report_dir) if run.settings.report_dir else {}


#: the condition sets ``kvbridge eval`` runs instead of its own conditions, first wanted first
CONDITION_SETS = (
    ConditionSet("frontier", lambda s: s.frontier is not None, eval_frontier),
    ConditionSet("recompute", lambda s: s.recompute.active, eval_recompute),
)


def evaluate_run(run, **callbacks):
    """:func:`kvbridge.evaluate.run.evaluate_run` with the recompute condition sets."""
    from kvbridge.evaluate.run import evaluate_run as run_eval

    return run_eval(run, condition_sets=CONDITION_SETS, **callbacks)


def evaluate_pair(pair, settings, *, host=None, **callbacks):
    """:func:`evaluate_run` of ``settings`` on a loaded :class:`~kvbridge.models.pair.ModelPair`."""
    from kvbridge.run import Run

    return evaluate_run(Run.of(pair, settings, host), **callbacks)
