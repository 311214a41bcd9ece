"""Run harness tasks under every condition and summarise (``kvbridge harness`` as a Python API).

::

    from kvbridge.harness.run import load_tasks, run_harness
    tasks = load_tasks(["recall"], {"recall": {"lengths": "256,1024"}})
    result = run_harness(source, target, mapping, tokenizer, tasks)
    result["tasks"]["recall"]["retention"], result["tasks"]["recall"]["gap_closed"]

Every item is answered under every condition (:func:`kvbridge.evaluate.runner.run_items`) from the
same ids (context with the tokenizer's special tokens, query without); per item the source prefills once (serving
``source``, ``transferred``, ``plain`` and the recompute points). The result (``SCHEMA``) holds,
per task and pooled over tasks (``overall``), accuracy with a Wilson interval per condition,
retention, floor-normalised retention, gap closed and paired differences
(:func:`kvbridge.stats.summarize`), per-group accuracies (``groups``), and every item's
score and answer (``items``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from kvbridge.harness.protocol import ChoiceItem, GenItem, HarnessError

SCHEMA = "kvbridge-harness/1"
#: characters of each completion kept in the result
KEEP_CHARS = 300
#: the ratios of :func:`kvbridge.stats.summarize` a summary (and each group's) holds
RATIOS = ("retention", "floor_normalised_retention", "gap_closed")


@dataclass(frozen=True)
class LoadedTask:
    name: str
    task: Any  # an instance of the task class
    options: Any  # its Options dataclass
    description: str = ""
    plugin: str = ""


def parse_task_options(pairs) -> dict:
    """``["recall.lengths=256,1024", "mc.path=f.jsonl"]`` (``-o`` values) -> ``{task: {key: value}}``."""
    out: dict = {}
    for item in pairs or ():
        key, sep, value = str(item).partition("=")
        task, dot, opt = key.strip().partition(".")
        if not sep or not dot or not task or not opt:
            raise HarnessError(f"-o {item!r} is not TASK.key=value", "pass e.g. -o recall.lengths=256,1024")
        out.setdefault(task, {})[opt.strip().replace("-", "_")] = value
    return out


def load_tasks(names, options: dict | None = None, *, host=None) -> list[LoadedTask]:
    """The registered tasks ``names`` with their options (``{task: {key: value}}``), checked."""
    from kvbridge.fit.protocol import build_options
    from kvbridge.plugins import host_or_default

    host = host_or_default(host)
    options = dict(options or {})
    names = [n.strip() for n in names if n and n.strip()]
    if not names:
        raise HarnessError("no tasks given", f"pass --tasks with some of {', '.join(host.names('task'))}")
    stray = [t for t in options if t not in names]
    if stray:
        raise HarnessError(
            f"-o names task {stray[0]!r}, which is not in --tasks", "add it to --tasks or drop the option"
        )
    out = []
    for name in names:
        task = host.get("task", name)  # unknown: a one-line PluginError with the closest names
        opts = build_options(task.Options, options.get(name), owner=f"task {name!r}")
        out.append(LoadedTask(name, task, opts, host.entry("task", name).description, host.owner("task", name)))
    return out


def code_tasks(tasks, allowed: bool) -> list[str]:
    """The names of ``tasks`` that run model-generated code, refused in one line unless ``allowed``."""
    needs = [t.name for t in tasks if getattr(t.task, "executes_code", False)]
    if needs and not allowed:
        raise HarnessError(
            f"task {needs[0]!r} runs model-generated code and code execution is not allowed",
            "pass --allow-code-execution (it runs in a limited subprocess, not a container)",
        )
    return needs


def _ids(tokenizer, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"]) if text else []


def _item_record(item, values: dict, chance: float) -> dict:
    """An item's record: ``values`` is ``{condition: (score, answer shown)}``."""
    if isinstance(item, ChoiceItem):
        truth = {"gold": item.gold}
    else:
        truth = {"answer": item.answer if isinstance(item.answer, (str, int, float)) else None}
    scores, answers = ({c: v[i] for c, v in values.items()} for i in (0, 1))
    return {"id": item.id, "group": item.group, "scores": scores, "answers": answers, **truth, "chance": chance}


def answer_one(answerer, task, item, cond: str, tokenizer) -> tuple[float, Any]:
    """``(score, answer shown)`` of one item under one condition (the shown answer: a choice's index,
    or the completion's first :data:`KEEP_CHARS` characters)."""
    # no_context keeps of the context only its special-token prefix (a BOS where the tokenizer adds one)
    ctx = (
        list(tokenizer("", add_special_tokens=True)["input_ids"])
        if cond == "no_context"
        else _ids(tokenizer, item.context, True)
    )
    query = _ids(tokenizer, item.query, False)
    custom = getattr(task, "answer", None)
    if custom is not None:  # the task answers and scores itself (lm-eval tasks)
        score, shown = custom(answerer, cond, item)
        return float(score), shown
    if isinstance(item, ChoiceItem):
        lls = [answerer.loglikelihood(cond, ctx, query, _ids(tokenizer, choice, False))[0] for choice in item.choices]
        pick = max(range(len(lls)), key=lambda i: lls[i])
        return float(pick == item.gold), pick
    if isinstance(item, GenItem):
        completion = answerer.generate(cond, ctx, query, max_new_tokens=item.max_new_tokens, stop=item.stop)
        score = float(task.score(item, completion))
        if not 0 <= score <= 1:
            raise HarnessError(f"task {task.name!r} scored {score} (outside 0..1)", "fix the task's score()")
        return score, completion[:KEEP_CHARS]
    raise HarnessError(
        f"task {task.name!r} returned a {type(item).__name__}, not a GenItem or ChoiceItem",
        "return kvbridge.harness.protocol items from items()",
    )


def _group_summary(records: list, conds: list, chance: dict) -> dict:
    """Per group: ``n``, accuracy with its Wilson interval per condition, and the ratios of
    :func:`kvbridge.stats.summarize` (no bootstrap) as plain values."""
    from kvbridge import stats

    groups: dict = {}
    for r in (r for r in records if r["group"]):
        groups.setdefault(r["group"], []).append(r)
    out = {}
    for g, recs in groups.items():
        scores = {c: [r["scores"][c] for r in recs] for c in conds if c in recs[0]["scores"]}
        summary = stats.summarize(scores, floor=sum(chance[r["id"]] for r in recs) / len(recs), bootstrap=0)
        out[g] = {
            "n": len(recs),
            "conditions": {c: {"accuracy": v["accuracy"], "ci": v["ci"]} for c, v in summary["conditions"].items()},
            **{k: summary[k]["value"] for k in RATIOS if k in summary},
        }
    return out


#: ``HarnessSettings.mapping`` of a run on model objects (:func:`run_harness`): no mapping reference
IN_MEMORY = "(in memory)"


def run_harness(source, target, mapping, tokenizer, tasks, *, host=None, progress=None, on_item=None, **settings):
    """:func:`run_tasks` on two model objects (``tokenizer``: the one they share); ``settings``: fields
    of :class:`~kvbridge.harness.settings.HarnessSettings` by name (``conditions=("target", ...)``)."""
    from kvbridge.harness.settings import HarnessSettings
    from kvbridge.run import model_run

    names = settings.pop("tasks", None) or tuple(t.name for t in tasks)
    s = HarnessSettings(mapping=settings.pop("mapping", IN_MEMORY), tasks=names, **settings)
    return run_tasks(
        model_run(source, target, s, host, tokenizer=tokenizer), tasks, mapping, progress=progress, on_item=on_item
    )


def run_tasks(run, tasks: list[LoadedTask], mapping, *, progress=None, on_item=None) -> dict:
    """Run ``tasks`` on ``run.pair`` through ``mapping`` under the conditions of ``run.settings`` (a
    :class:`~kvbridge.harness.settings.HarnessSettings`: ``conditions``, default every one that applies;
    the recompute and frontier points; ``limit`` items per task, 0: all) and return the result dict.
    Each item is answered under each condition by :func:`kvbridge.evaluate.runner.run_items`;
    ``on_item(task, record)`` after each item (partial results); ``progress(done, total)``."""
    import contextlib

    from kvbridge.evaluate import model_info
    from kvbridge.evaluate.runner import run_items
    from kvbridge.harness.conditions import Answerer, parse_recompute_layers, parse_recompute_tokens
    from kvbridge.harness.sandbox import code_execution_allowed
    from kvbridge.progress import json_ready

    s, src, tgt = run.settings, run.source, run.target
    tokenizer = tgt.tokenizer
    needs_exec = code_tasks(tasks, s.allow_code_execution)
    recompute = parse_recompute_layers(s.recompute_layers, tgt.spec.num_layers)
    recompute += parse_recompute_tokens(s.recompute_tokens)
    frontier = s.frontier_ratios
    answerer = Answerer(
        src.model, tgt.model, mapping, tokenizer, recompute=recompute, frontier=frontier, sink=s.sink, host=run.host
    )
    conds = answerer.conditions(list(s.conditions) or None)
    built = []
    for t in tasks:
        items = list(t.task.items(t.options, tokenizer))[: int(s.limit) or None]
        if not items:
            raise HarnessError(f"task {t.name!r} built no items", "check its options (-o NAME.key=value)")
        built.append((t, items))
    total, done = sum(len(items) for _, items in built), 0
    all_items, meta, notes = {}, {}, []
    t_start = time.perf_counter()
    with code_execution_allowed() if needs_exec else contextlib.nullcontext():
        for t, items in built:
            tconds = [c for c in conds if c != "no_context" or getattr(t.task, "no_context", False)]
            if "no_context" in conds and "no_context" not in tconds:
                notes.append(f"{t.name}: no no_context condition (the context is the task)")

            def answered(item, values, t=t):
                nonlocal done
                rec = _item_record(item, values, float(t.task.chance(item)))
                done += 1
                if on_item is not None:
                    on_item(t.name, rec)
                if progress is not None:
                    progress(done, total)
                return rec

            answer = lambda item, cond, t=t: answer_one(answerer, t.task, item, cond, tokenizer)  # noqa: E731
            all_items[t.name] = run_items(tconds, items, answer, after_item=answered)
            options = asdict(t.options) if is_dataclass(t.options) else {}
            meta[t.name] = {"description": t.description, "plugin": t.plugin, "options": options}
    result_tasks, overall = _summaries(all_items, conds, meta, s.bootstrap, s.seed)
    info = {"name": getattr(mapping, "name", type(mapping).__name__), "exact": bool(getattr(mapping, "exact", False))}
    if s.mapping != IN_MEMORY:
        info = {"path": None if s.mapping == "identity" else str(s.mapping), **info}
    definitions = dict(DEFINITIONS)
    if frontier:
        definitions["truncated@R"] = (
            f"the target's own prefill of the first {answerer.sink} (sink) and the last "
            "ceil(R*P) of the P cached context tokens only, at their original positions (no transfer)"
        )
        definitions["tail@R"] = (
            "the same rows computed by the target at every layer over the mapped cache of the "
            "others (tail@0: the plain transfer)"
        )
    return json_ready(
        {
            "schema": SCHEMA,
            "source": model_info(src.model, answerer.sspec, src.name),
            "target": model_info(tgt.model, answerer.tspec, tgt.name),
            "mapping": info,
            "conditions": conds,
            "recompute": [{"name": r.name, **asdict(r)} for r in recompute],  # kind, spec, layers, ratio
            "frontier": {"ratios": list(frontier), "sink": answerer.sink, "conditions": list(answerer.frontier)}
            if frontier
            else None,
            "settings": {k: getattr(s, k) for k in ("bootstrap", "seed", "limit")}
            | {"allow_code_execution": bool(s.allow_code_execution)},
            "tasks": result_tasks,
            "overall": overall,
            "items": all_items,
            "timing": {"seconds": time.perf_counter() - t_start, **answerer.timing, "reused": dict(answerer.reused)},
            "definitions": definitions,
            "notes": notes,
        },
        stringify=False,
    )


#: what the result's summary fields mean (``definitions``; the frontier adds its two)
DEFINITIONS = {
    "accuracy": "mean item score; ci: Wilson 95%",
    "retention": "transferred / target",
    "floor_normalised_retention": "(transferred - floor) / (target - floor), floor = the task's chance level",
    "gap_closed": "(transferred - source) / (target - source)",
    "paired": "per-item differences a - b (mean, paired bootstrap 95%); binary: discordant counts and exact McNemar p",
}


def _summaries(items: dict, conds: list, meta: dict, bootstrap: int, seed: int) -> tuple[dict, dict]:
    """``(per-task summaries, overall)`` from the per-item records of each task (``meta``: a task's
    description, plugin and options, kept beside its summary)."""
    from kvbridge import stats

    tasks, pooled, pooled_chance = {}, {}, []
    for name, records in items.items():
        tconds = [c for c in conds if c in records[0]["scores"]]
        chance = {r["id"]: r.get("chance", meta[name].get("floor")) for r in records}
        scores = {c: [r["scores"][c] for r in records] for c in tconds}
        summary = stats.summarize(scores, floor=sum(chance.values()) / len(records), bootstrap=bootstrap, seed=seed)
        summary.update(
            {k: meta[name][k] for k in ("description", "plugin", "options") if k in meta[name]},
            groups=_group_summary(records, tconds, chance),
        )
        tasks[name] = summary
        for c in tconds:
            pooled.setdefault(c, []).extend(scores[c])
        pooled_chance.extend(chance[r["id"]] for r in records)
    common = [c for c in conds if all(c in tasks[t]["conditions"] for t in tasks)]
    overall = stats.summarize(
        {c: pooled[c] for c in common}, floor=sum(pooled_chance) / len(pooled_chance), bootstrap=bootstrap, seed=seed
    )
    overall["tasks"] = list(tasks)
    return tasks, overall


def resummarize(result: dict, *, bootstrap: int | None = None, seed: int | None = None) -> dict:
    """``result`` with every summary (tasks, groups, overall) recomputed from its per-item scores (e.g.
    after a change of definitions, or with another bootstrap), the items themselves unchanged."""
    import copy

    from kvbridge.progress import json_ready

    out = copy.deepcopy(result)
    bootstrap = out["settings"]["bootstrap"] if bootstrap is None else int(bootstrap)
    seed = out["settings"]["seed"] if seed is None else int(seed)
    out["settings"].update(bootstrap=bootstrap, seed=seed)
    out["tasks"], out["overall"] = _summaries(out["items"], out["conditions"], out["tasks"], bootstrap, seed)
    return json_ready(out, stringify=False)
