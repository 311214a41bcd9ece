"""``kvbridge steer eval``: does steering change the behaviour, how reliably, and at what cost?

Arms (every arm samples the same seeds ``0 .. N-1``, so arms are paired sample by sample):

- ``none``: the prompt alone (the reference);
- ``visible``: the instruction in the prompt (a system turn with a chat template, else a line before
  the prompt), prefilled visibly;
- ``pack``: the same instruction hidden in a prefix pack (saved and restored through
  :mod:`kvbridge.prefix.packs`: zero forward passes), the prompt prefilled after it (exact-token split);
- ``kv``: the steering vector added once to the prompt's last cached position (``kv-vector``:
  ``ck``, ``cv``, ``layers``), or to every cached prompt position (``at="prompt"``);
- ``actadd``: residual-stream activation addition of the vector's residual directions built from the
  same pairs (coefficient ``ca``, every position and step: the standard baseline);
- ``random``: a random direction with the vector's norm per layer and KV head, added like ``kv``
  (the control: what any perturbation of that size does);
- any name given in ``extra_vectors`` (e.g. a vector moved from another model): added like ``kv``.

Per arm: the behaviour rate (the scorer's ``True`` share) with its 95% Wilson interval; the paired
difference to ``none`` (mean over seeds, bootstrap 95% interval over seeds, the discordant counts
and the exact McNemar p-value); and the cost: the NLL of the unsteered arm's own continuations
under the arm (minus their NLL under ``none``), the KL divergence from the unsteered next-token
distribution along those continuations (``KL(none || arm)``, mean over positions, and at the first
step), and the repeated-3-gram share of the arm's own samples (``degenerate``: at least half
repeated). A coefficient sweep multiplies the ``kv`` / ``actadd`` / ``random`` coefficients and
draws behaviour rate against KL cost (``sweep.png``).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Callable

from kvbridge.errors import KVBridgeError
from kvbridge.evaluate.report import md_table
from kvbridge.stats import mcnemar_p, wilson
from kvbridge.steer.prompts import Scenario, chat_mode, guide_scenario, prompt_scenario
from kvbridge.steer.run import check_length, decode, setup_for, stop_ids_of
from kvbridge.steer.settings import ARMS, SWEPT, SteerEvalSettings

#: settings fields that name what the caller loaded (reported beside ``settings``, not in it)
_NAMED = ("vector", "prompt", "scorer", "instruction", "extra", "out", "overwrite")


# -- statistics ---------------------------------------------------------------------------------------
def paired(arm: list[bool], ref: list[bool], *, bootstrap: int = 2000, seed: int = 0) -> dict:
    """Mean paired difference ``arm - ref`` with a percentile bootstrap 95% interval over seeds
    (:func:`kvbridge.evaluate.metrics.bootstrap_indices`: the resamples of every paired interval)."""
    import torch

    from kvbridge.evaluate.metrics import bootstrap_indices, percentile_interval

    d = torch.tensor([int(a) - int(r) for a, r in zip(arm, ref)], dtype=torch.float64)
    n = len(d)
    lo, hi = (
        percentile_interval(d[bootstrap_indices(n, bootstrap, seed)].mean(1)) if n and bootstrap else [math.nan] * 2
    )
    b = sum(1 for a, r in zip(arm, ref) if a and not r)
    c = sum(1 for a, r in zip(arm, ref) if r and not a)
    return {
        "diff": float(d.mean()) if n else float("nan"),
        "ci95": [round(lo, 4), round(hi, 4)],
        "arm_only": b,
        "reference_only": c,
        "mcnemar_p": round(mcnemar_p(b, c), 6),
    }


def rate(scores: list[bool]) -> dict:
    k, n = sum(scores), len(scores)
    lo, hi = wilson(k, n) or (0.0, 1.0)
    return {"k": k, "n": n, "rate": k / n if n else float("nan"), "wilson95": [round(lo, 4), round(hi, 4)]}


def _mean(xs) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


# -- the evaluation -----------------------------------------------------------------------------------
@dataclass
class _Ctx:
    model: Any
    tokenizer: Any
    vector: Any
    scorer: Callable[[str], bool]
    settings: SteerEvalSettings
    host: Any
    stops: tuple
    scenario: Any
    extra: dict  # name -> the extra vectors, run like kv
    none_rows: list = field(default_factory=list)
    none_setup: Any = None


def _setup(ctx: _Ctx, arm: str, mult: float = 1.0):
    """``(Setup, record)`` of one arm at coefficient multiplier ``mult``."""
    from kvbridge.prefix import packs
    from kvbridge.steer.sample import Setup
    from kvbridge.steer.vectors import random_like

    s = ctx.settings
    if arm == "none":
        return ctx.none_setup, {"method": "none"}
    if arm in ("visible", "pack"):
        if not s.instruction:
            raise KVBridgeError(f"arm {arm!r} needs the instruction", "pass --instruction TEXT (or drop the arm)")
        guided = guide_scenario(ctx.tokenizer, s.instruction, s.prompt, chat=chat_mode(ctx.tokenizer, s.chat))
        if arm == "visible":
            ids = guided.joint
            visible = Scenario(ids[:-1], ids[-1:], (len(ids) - 2, len(ids) - 1), guided.text, "prompt")
            setup, _ = setup_for(ctx.model, visible, host=ctx.host)
            return setup, {"method": "instruction visible", "tokens": len(ids)}
        tfp = packs.tokenizer_fingerprint(ctx.tokenizer)
        pack = packs.round_trip(ctx.model, guided.prefix_ids, guided.guide_text, tokenizer_fp=tfp, host=ctx.host)
        return Setup(pack.state_for(ctx.model), guided.live_ids), {
            "method": "instruction in a pack (restored, zero forward passes)",
            "guide_tokens": len(guided.prefix_ids),
        }
    steer = partial(setup_for, ctx.model, ctx.scenario, prefix=ctx.none_setup.prefix, host=ctx.host)
    if arm == "actadd":
        layers = s.actadd_layers or s.layers
        return steer(method="actadd", options={"coefficient": s.ca * mult}, vector=ctx.vector, layers=layers)
    # a kv-vector arm: the vector, a random one of its size, or an extra vector
    vectors = {**ctx.extra, "kv": ctx.vector}
    if arm != "random" and arm not in vectors:
        raise KVBridgeError(f"unknown arm {arm!r}", f"use {', '.join(ARMS + tuple(ctx.extra))}")
    vector = random_like(ctx.vector, s.random_seed) if arm == "random" else vectors[arm]
    edit = (0, len(ctx.scenario.prefix_ids)) if s.at == "prompt" else None
    options = {"ck": s.ck * mult, "cv": s.cv * mult}
    return steer(method="kv-vector", options=options, vector=vector, layers=s.layers, edit=edit)


def _run_arm(ctx: _Ctx, arm: str, setup, record: dict, samples: int) -> dict:
    from kvbridge.prefix.diverge import Sampler
    from kvbridge.steer.sample import costs, repetition, sample

    s = ctx.settings
    t0 = time.perf_counter()
    seeds = list(range(samples))
    res = sample(
        ctx.model, setup, seeds, s.max_new_tokens, Sampler(s.temperature, s.top_p), stop_ids=ctx.stops, host=ctx.host
    )
    texts = [decode(ctx.tokenizer, r, ctx.stops) for r in res["tokens"]]
    scores = [bool(ctx.scorer(t)) for t in texts]
    if arm == "none":
        ctx.none_rows = res["tokens"]
    c = costs(ctx.model, ctx.none_setup, setup, ctx.none_rows[:samples], host=ctx.host)
    reps = [repetition(r) for r in res["tokens"]]
    return {
        "setup": record,
        **rate(scores),
        "scores": [int(x) for x in scores],
        "cost": {
            "nll": _mean(c["nll_steered"]),
            "delta_nll": _mean([a - b for a, b in zip(c["nll_steered"], c["nll_reference"])]),
            "kl": _mean(c["kl"]),
            "kl_first": _mean(c["kl_first"]),
            "repetition": _mean(reps),
            "degenerate_rate": sum(r >= 0.5 for r in reps) / len(reps) if reps else float("nan"),
            "mean_tokens": _mean([float(len(r)) for r in res["tokens"]]),
        },
        "examples": texts[:3],
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _relative_edit(ctx: _Ctx) -> dict:
    """``||cv * d_v|| / ||v||`` and ``||ck * d_k|| / ||k||`` at the edited positions, mean over layers, heads
    and positions."""
    from kvbridge.steer.edit import layers_of

    state = ctx.none_setup.prefix
    start, stop = (0, len(ctx.scenario.prefix_ids)) if ctx.settings.at == "prompt" else ctx.scenario.edit
    chosen = layers_of(ctx.settings.layers, state.num_layers)
    content = state.strip_rope() if ctx.vector.key_space == "content" else state
    out = {}
    for name, group, vec, c in (
        ("keys", content.keys, ctx.vector.keys, ctx.settings.ck),
        ("values", state.values, ctx.vector.values, ctx.settings.cv),
    ):
        ratios = []
        for i in chosen:
            own = group[i][0, :, start:stop].float().norm(dim=-1)  # [H, P]
            ratios.extend((abs(c) * vec[i].norm(dim=-1)[:, None] / own.clamp(min=1e-12)).reshape(-1).tolist())
        out[name] = round(_mean(ratios), 4)
    return out


def evaluate(
    model,
    tokenizer,
    vector,
    *,
    scorer: Callable[[str], bool],
    settings: SteerEvalSettings,
    extra_vectors: dict | None = None,
    host=None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Every arm of the module docstring on ``settings.prompt``, with the steering ``vector``, the
    ``scorer`` and the ``extra_vectors`` loaded (``settings.vector`` / ``scorer`` / ``extra`` name
    them); the result is JSON-ready."""
    from kvbridge.evaluate.runner import run_items
    from kvbridge.plugins import host_or_default

    host = host_or_default(host)
    extra = dict(extra_vectors or {})
    log = log or (lambda _msg: None)
    chat = chat_mode(tokenizer, settings.chat)
    scenario = prompt_scenario(tokenizer, settings.prompt, chat=chat)
    check_length(model, scenario, settings.max_new_tokens, host)
    ctx = _Ctx(model, tokenizer, vector, scorer, settings, host, stop_ids_of(tokenizer, model), scenario, extra)
    ctx.none_setup, _ = setup_for(model, scenario, host=host)
    arms = ["none"] + [a for a in settings.arms if a != "none"]
    t0 = time.perf_counter()
    result: dict = {
        "prompt": settings.prompt,
        "instruction": settings.instruction,
        "scorer": settings.scorer,
        "chat": chat,
        "settings": {
            **{k: v for k, v in asdict(settings).items() if k not in _NAMED},
            "arms": list(arms),
            "sweep_arms": list(settings.sweep_arms or SWEPT),
        },
        "sampler": {
            "kind": "inverse-cdf over token ids, one uniform per step, torch.Generator(seed) per sample",
            "seeds": f"0..{settings.samples - 1}",
        },
        "vector": {k: v for k, v in vector.info.items() if k != "model"},
        "relative_edit": _relative_edit(ctx),
        "arms": {},
        "sweep": {},
    }

    def arm_result(samples: int, arm: str) -> dict:
        res = _run_arm(ctx, arm, *_setup(ctx, arm), samples)
        log(
            f"{arm:<14} {res['k']:>3}/{res['n']} = {res['rate']:.2f}  KL {res['cost']['kl']:.3f}  "
            f"dNLL {res['cost']['delta_nll']:+.3f}  rep {res['cost']['repetition']:.2f}  ({res['seconds']:.0f}s)"
        )
        return res

    # the arms are the conditions of one item (the prompt, sampled over the seeds); the reference first
    result["arms"] = run_items(arms, [settings.samples], arm_result)[0]
    ref = result["arms"]["none"]["scores"]
    for arm, res in result["arms"].items():
        res["paired_vs_none"] = paired(res["scores"], ref, bootstrap=settings.bootstrap)

    def sweep_point(samples: int, point: tuple) -> None:  # samples <= settings.samples (the settings check)
        arm, mult = point
        res = _run_arm(ctx, arm, *_setup(ctx, arm, mult), samples)
        res.pop("examples")
        res["paired_vs_none"] = paired(res["scores"], ref[:samples], bootstrap=settings.bootstrap)
        result["sweep"].setdefault(arm, []).append({"multiplier": mult, **res})
        log(f"sweep {arm:<8} x{mult:<6g} {res['k']:>3}/{res['n']} = {res['rate']:.2f}  KL {res['cost']['kl']:.3f}")

    swept = [a for a in settings.sweep_arms or SWEPT if a in arms or a in extra]
    points = [(arm, float(m)) for m in settings.sweep for arm in swept]
    run_items(points, [settings.sweep_samples or settings.samples], sweep_point)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


# -- rendering ------------------------------------------------------------------------------------------
def _fmt_rate(r: dict) -> str:
    return f"{r['k']}/{r['n']} = {r['rate']:.2f} [{r['wilson95'][0]:.2f}, {r['wilson95'][1]:.2f}]"


def table(result: dict) -> list[str]:
    """The Markdown table of the arms."""
    heads = ("arm", "behaviour [Wilson 95%]", "paired diff vs none [bootstrap 95%] (+/-, McNemar p)")
    heads += ("ΔNLL of unsteered text", "KL(none‖arm) mean / first step", "repeated 3-grams / degenerate")
    rows = []
    for arm, r in result["arms"].items():
        p, c = r["paired_vs_none"], r["cost"]
        pd = (
            f"{p['diff']:+.2f} [{p['ci95'][0]:+.2f}, {p['ci95'][1]:+.2f}] "
            f"(+{p['arm_only']}/-{p['reference_only']}, p={p['mcnemar_p']:.2g})"
        )
        rows.append([arm, _fmt_rate(r), "-" if arm == "none" else pd, f"{c['delta_nll']:+.3f}"])
        rows[-1] += [f"{c['kl']:.3f} / {c['kl_first']:.3f}", f"{c['repetition']:.2f} / {c['degenerate_rate']:.2f}"]
    return md_table(heads, rows)


def sweep_table(result: dict) -> list[str]:
    if not result.get("sweep"):
        return []
    rows = [
        [arm, f"x{pt['multiplier']:g}", _fmt_rate(pt), f"{pt['cost']['kl']:.3f}", f"{pt['cost']['delta_nll']:+.3f}"]
        + [f"{pt['cost']['repetition']:.2f}"]
        for arm, points in result["sweep"].items()
        for pt in points
    ]
    return md_table(("arm", "multiplier", "behaviour [Wilson 95%]", "KL(none‖arm)", "ΔNLL", "repeated 3-grams"), rows)


def plot_sweep(result: dict, path, title: str = "") -> str | None:
    """Behaviour rate against KL cost per swept arm (PNG, matplotlib Agg); None when there is no sweep
    or matplotlib is not installed."""
    if not result.get("sweep"):
        return None
    from kvbridge.evaluate.report import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.axhline(result["arms"]["none"]["rate"], color="grey", ls=":", label="none")
    for arm in ("visible", "pack"):
        if arm in result["arms"]:
            r = result["arms"][arm]
            ax.scatter([max(r["cost"]["kl"], 1e-4)], [r["rate"]], marker="s", label=arm)
    for arm, points in result["sweep"].items():
        xs = [max(p["cost"]["kl"], 1e-4) for p in points]
        ys = [p["rate"] for p in points]
        lo = [p["rate"] - p["wilson95"][0] for p in points]
        hi = [p["wilson95"][1] - p["rate"] for p in points]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=2, label=arm)
        for x, y, p in zip(xs, ys, points):
            ax.annotate(f"x{p['multiplier']:g}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("cost: KL(unsteered || steered), mean over the unsteered text (log)")
    ax.set_ylabel(f"behaviour rate ({result.get('scorer', '')})")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title or f"coefficient sweep: {result.get('scorer', '')}", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(plt, fig, path)
    return str(path)


def lines(result: dict) -> list[str]:
    s = result["settings"]
    out = [
        f"prompt {result['prompt']!r}, scorer {result['scorer']}, {s['samples']} samples x {s['max_new_tokens']} "
        f"tokens per arm (temperature {s['temperature']}, top-p {s['top_p']}), kv: ck {s['ck']} cv {s['cv']} at "
        f"layers {s['layers']}, {'every prompt position' if s.get('at') == 'prompt' else 'the last cached position'}, actadd: ca {s['ca']}; relative edit size |c d|/|x|: keys "
        f"{result['relative_edit']['keys']}, values {result['relative_edit']['values']}",
        "",
    ]
    out += table(result)
    if result.get("sweep"):
        out += ["", *sweep_table(result)]
    out.append(f"\n({result['seconds']:.0f} s)")
    return out


__all__ = [
    "ARMS",
    "evaluate",
    "paired",
    "rate",
    "mcnemar_p",
    "table",
    "sweep_table",
    "plot_sweep",
    "lines",
]
