"""Run harness tasks under every condition and summarise (``kvbridge harness`` as a Python API).

::

    from kvbridge.harness.run import load_tasks, run_harness
    tasks = load_tasks(["recall"], {"recall": {"lengths": "256,1024"}})
    result = run_harness(source, target, mapping, tokenizer, tasks)
    result["tasks"]["recall"]["retention"], result["tasks"]["recall"]["gap_closed"]

Every item is tokenised once (context with the tokenizer's special tokens, query without) and
answered under every condition from the same ids; per item the source prefills once (serving
``source``, ``transferred``, ``plain`` and the recompute points). The result (``SCHEMA``) holds,
per task and pooled over tasks (``overall``), accuracy with a Wilson interval per condition,
retention, floor-normalised retention, gap closed and paired differences
(:func:`kvbridge.stats.summarize`), per-group accuracies (``groups``), and every item's
score and answer (``items``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kvbridge.harness.protocol import ChoiceItem, GenItem, HarnessError

SCHEMA = "kvbridge-harness/1"
#: characters of each completion kept in the result
KEEP_CHARS = 300


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


def _ids(tokenizer, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"]) if text else []


def _item_record(item) -> dict:
    rec = {"id": item.id, "group": item.group, "scores": {}, "answers": {}}
    if isinstance(item, ChoiceItem):
        rec["gold"] = item.gold
    else:
        rec["answer"] = item.answer if isinstance(item.answer, (str, int, float)) else None
    return rec


def answer_item(answerer, task, item, conds, tokenizer) -> dict:
    """Score one item under each condition: ``{"scores": {cond: x}, "answers": {cond: text or choice}}``."""
    ctx = _ids(tokenizer, item.context, True)
    query = _ids(tokenizer, item.query, False)
    bos = _ids(tokenizer, "", True)  # what no_context keeps of the context: the special-token prefix
    rec = _item_record(item)
    custom = getattr(task, "answer", None)
    for cond in conds:
        c = bos if cond == "no_context" else ctx
        if custom is not None:  # the task answers and scores itself (lm-eval tasks)
            score, shown = custom(answerer, cond, item)
            rec["scores"][cond], rec["answers"][cond] = float(score), shown
        elif isinstance(item, ChoiceItem):
            lls = [answerer.loglikelihood(cond, c, query, _ids(tokenizer, choice, False))[0] for choice in item.choices]
            pick = max(range(len(lls)), key=lambda i: lls[i])
            rec["scores"][cond] = float(pick == item.gold)
            rec["answers"][cond] = pick
        elif isinstance(item, GenItem):
            completion = answerer.generate(cond, c, query, max_new_tokens=item.max_new_tokens, stop=item.stop)
            score = float(task.score(item, completion))
            if not 0 <= score <= 1:
                raise HarnessError(f"task {task.name!r} scored {score} (outside 0..1)", "fix the task's score()")
            rec["scores"][cond] = score
            rec["answers"][cond] = completion[:KEEP_CHARS]
        else:
            raise HarnessError(
                f"task {task.name!r} returned a {type(item).__name__}, not a GenItem or ChoiceItem",
                "return kvbridge.harness.protocol items from items()",
            )
    return rec


def _group_summary(records: list, conds: list, chance: dict) -> dict:
    from kvbridge import stats

    groups: dict = {}
    for r in records:
        groups.setdefault(r["group"], []).append(r)
    out = {}
    for g, recs in groups.items():
        if not g:
            continue
        n = len(recs)
        row = {"n": n, "conditions": {}}
        for c in conds:
            if c not in recs[0]["scores"]:
                continue
            total = sum(r["scores"][c] for r in recs)
            ci = stats.wilson(total, n)
            row["conditions"][c] = {"accuracy": total / n, "ci": list(ci) if ci else None}
        acc = {c: v["accuracy"] for c, v in row["conditions"].items()}
        floor = sum(chance[r["id"]] for r in recs) / n
        if "transferred" in acc and "target" in acc:
            row["retention"] = stats.retention(acc["transferred"], acc["target"])
            row["floor_normalised_retention"] = stats.floor_retention(acc["transferred"], acc["target"], floor)
            if "source" in acc:
                row["gap_closed"] = stats.gap_closed(acc["transferred"], acc["target"], acc["source"])
        out[g] = row
    return out


def run_harness(
    source,
    target,
    mapping,
    tokenizer,
    tasks: list[LoadedTask],
    *,
    conditions=None,
    recompute=(),
    frontier=(),
    sink: int | None = None,
    allow_code_execution: bool = False,
    bootstrap: int = 1000,
    seed: int = 0,
    limit: int = 0,
    host=None,
    progress=None,
    on_item=None,
    source_name: str = "",
    target_name: str = "",
    mapping_info: dict | None = None,
) -> dict:
    """Run ``tasks`` under ``conditions`` (default: every one that applies) and return the result dict.

    ``recompute``: :class:`kvbridge.harness.conditions.Recompute` points; ``frontier``: shares R of
    the context for the frontier's ``truncated@R`` / ``tail@R`` conditions, with ``sink`` sink tokens
    (default :data:`kvbridge.recompute.frontier.DEFAULT_SINK`); ``limit``: items per task (0: all).
    ``on_item(task, record)`` after each item (partial results); ``progress(done, total)``.
    """
    import contextlib

    from kvbridge import stats
    from kvbridge.harness.conditions import Answerer
    from kvbridge.harness.sandbox import code_execution_allowed

    needs_exec = [t.name for t in tasks if getattr(t.task, "executes_code", False)]
    if needs_exec and not allow_code_execution:
        raise HarnessError(
            f"task {needs_exec[0]!r} runs model-generated code and code execution is not allowed",
            "pass --allow-code-execution (it runs in a limited subprocess, not a container)",
        )
    answerer = Answerer(
        source, target, mapping, tokenizer, recompute=recompute, frontier=frontier, sink=sink, host=host
    )
    conds = answerer.conditions(conditions)
    built = []
    for t in tasks:
        items = list(t.task.items(t.options, tokenizer))
        if limit:
            items = items[: int(limit)]
        if not items:
            raise HarnessError(f"task {t.name!r} built no items", "check its options (-o NAME.key=value)")
        built.append((t, items))
    total = sum(len(items) for _, items in built)
    done = 0
    result_tasks, all_items, notes = {}, {}, []
    pooled: dict = {}
    pooled_chance: list = []
    t_start = time.perf_counter()
    with code_execution_allowed() if needs_exec else contextlib.nullcontext():
        for t, items in built:
            tconds = [c for c in conds if c != "no_context" or getattr(t.task, "no_context", False)]
            if "no_context" in conds and "no_context" not in tconds:
                notes.append(f"{t.name}: no no_context condition (the context is the task)")
            records, chance = [], {}
            for item in items:
                rec = answer_item(answerer, t.task, item, tconds, tokenizer)
                chance[item.id] = rec["chance"] = float(t.task.chance(item))
                records.append(rec)
                done += 1
                if on_item is not None:
                    on_item(t.name, rec)
                if progress is not None:
                    progress(done, total)
            scores = {c: [r["scores"][c] for r in records] for c in tconds}
            floor = sum(chance.values()) / len(records)
            summary = stats.summarize(scores, floor=floor, bootstrap=bootstrap, seed=seed)
            summary.update(
                description=t.description,
                plugin=t.plugin,
                options=_options_dict(t.options),
                groups=_group_summary(records, tconds, chance),
            )
            result_tasks[t.name] = summary
            all_items[t.name] = records
            for c in tconds:
                pooled.setdefault(c, []).extend(scores[c])
            pooled_chance.extend(chance[r["id"]] for r in records)
    common = [c for c in conds if all(c in result_tasks[t]["conditions"] for t in result_tasks)]
    overall = stats.summarize(
        {c: pooled[c] for c in common}, floor=sum(pooled_chance) / len(pooled_chance), bootstrap=bootstrap, seed=seed
    )
    overall["tasks"] = list(result_tasks)
    from kvbridge.progress import json_ready

    return json_ready(
        {
            "schema": SCHEMA,
            "source": _model_info(source, answerer.sspec, source_name),
            "target": _model_info(target, answerer.tspec, target_name),
            "mapping": mapping_info
            or {
                "name": getattr(mapping, "name", type(mapping).__name__),
                "exact": bool(getattr(mapping, "exact", False)),
            },
            "conditions": conds,
            "recompute": [
                {"name": r.name, "kind": r.kind, "spec": r.spec, "layers": list(r.layers), "ratio": r.ratio}
                for r in recompute
            ],
            "frontier": {
                "ratios": sorted({float(r) for r in frontier}),
                "sink": answerer.sink,
                "conditions": list(answerer.frontier),
            }
            if frontier
            else None,
            "settings": {
                "bootstrap": bootstrap,
                "seed": seed,
                "limit": int(limit),
                "allow_code_execution": bool(allow_code_execution),
            },
            "tasks": result_tasks,
            "overall": overall,
            "items": all_items,
            "timing": {"seconds": time.perf_counter() - t_start, **answerer.timing, "reused": dict(answerer.reused)},
            "definitions": {
                "accuracy": "mean item score; ci: Wilson 95%",
                "retention": "transferred / target",
                "floor_normalised_retention": "(transferred - floor) / (target - floor), floor = the task's chance level",
                "gap_closed": "(transferred - source) / (target - source)",
                "paired": "per-item differences a - b (mean, paired bootstrap 95%); binary: discordant counts and exact "
                "McNemar p",
                **(
                    {
                        "truncated@R": f"the target's own prefill of the first {answerer.sink} (sink) and the last "
                        "ceil(R*P) of the P cached context tokens only, at their original positions (no transfer)",
                        "tail@R": "the same rows computed by the target at every layer over the mapped cache of the "
                        "others (tail@0: the plain transfer)",
                    }
                    if frontier
                    else {}
                ),
            },
            "notes": notes,
        },
        stringify=False,
    )


def resummarize(result: dict, *, bootstrap: int | None = None, seed: int | None = None) -> dict:
    """``result`` with every summary (tasks, groups, overall) recomputed from its per-item scores (e.g.
    after a change of definitions, or with another bootstrap), the items themselves unchanged."""
    import copy

    from kvbridge import stats

    out = copy.deepcopy(result)
    bootstrap = out["settings"]["bootstrap"] if bootstrap is None else int(bootstrap)
    seed = out["settings"]["seed"] if seed is None else int(seed)
    out["settings"].update(bootstrap=bootstrap, seed=seed)
    pooled, pooled_chance = {}, []
    for name, records in out["items"].items():
        old = out["tasks"][name]
        conds = [c for c in out["conditions"] if c in records[0]["scores"]]
        chance = {r["id"]: r.get("chance", old["floor"]) for r in records}
        scores = {c: [r["scores"][c] for r in records] for c in conds}
        summary = stats.summarize(scores, floor=sum(chance.values()) / len(records), bootstrap=bootstrap, seed=seed)
        summary.update(
            {k: old[k] for k in ("description", "plugin", "options") if k in old},
            groups=_group_summary(records, conds, chance),
        )
        out["tasks"][name] = summary
        for c in conds:
            pooled.setdefault(c, []).extend(scores[c])
        pooled_chance.extend(chance[r["id"]] for r in records)
    common = [c for c in out["conditions"] if all(c in out["tasks"][t]["conditions"] for t in out["tasks"])]
    out["overall"] = stats.summarize(
        {c: pooled[c] for c in common}, floor=sum(pooled_chance) / len(pooled_chance), bootstrap=bootstrap, seed=seed
    )
    out["overall"]["tasks"] = list(out["tasks"])
    from kvbridge.progress import json_ready

    return json_ready(out, stringify=False)


def _options_dict(options) -> dict:
    from dataclasses import asdict, is_dataclass

    return asdict(options) if is_dataclass(options) else {}


def _model_info(model, spec, name: str) -> dict:
    return {
        "name": name or str(getattr(model.config, "_name_or_path", "") or ""),
        "model_type": spec.model_type,
        "layers": spec.num_layers,
        "kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
    }


__all__ = ["SCHEMA", "LoadedTask", "load_tasks", "parse_task_options", "run_harness", "answer_item", "resummarize"]
