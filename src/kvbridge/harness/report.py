"""A harness result as a terminal table, JSON, Markdown (``summary.md``) and a PNG (``accuracy.png``).

One row per task (and per group of a task, e.g. each recall length and position), then the pooled
``overall`` row: accuracy [Wilson 95%] per condition, then retention, floor-normalised retention
and gap closed side by side (retention is never shown without the gap closed). Paired
differences follow the table.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvbridge.harness.run import RATIOS as _RATIO_KEYS

REPORT_KIND = "kvbridge-harness-report"
#: the summary ratios (a summary's keys) and their labels
RATIOS = dict(zip(_RATIO_KEYS, ("retention", "floor-norm retention", "gap closed")))


def _acc(row: dict | None) -> str:
    if not row or row.get("accuracy") is None:
        return "-"
    ci = row.get("ci")
    return f"{row['accuracy']:.3f} [{ci[0]:.2f},{ci[1]:.2f}]" if ci else f"{row['accuracy']:.3f}"


def _num(x, fmt="{:.3f}") -> str:
    if isinstance(x, dict):
        v, ci = x.get("value"), x.get("ci")
        if v is None:
            return "n/a"
        return fmt.format(_z(v)) + (f" [{_z(ci[0]):.2f},{_z(ci[1]):.2f}]" if ci else "")
    return "n/a" if x is None else fmt.format(_z(x))


def _z(x: float) -> float:
    """No "-0.000": tiny negatives from float noise print as 0."""
    return round(x, 6) + 0.0


def _summaries(result: dict) -> list[tuple[str, dict]]:
    """``(name, summary)`` of every task, then ``overall`` where there are several tasks."""
    return list(result["tasks"].items()) + ([("overall", result["overall"])] if len(result["tasks"]) > 1 else [])


def rows(result: dict) -> tuple[list[str], list[list[str]]]:
    conds = list(result["conditions"])
    heads = ["task", "n"] + conds + list(RATIOS.values())

    def row(name, t):
        return [name, str(t["n"])] + [_acc(t["conditions"].get(c)) for c in conds] + [_num(t.get(k)) for k in RATIOS]

    out = []
    for name, t in _summaries(result):
        out.append(row(name, t))  # then a task's groups (the pooled row has none)
        out += [row(f"  {g}", group) for g, group in (t.get("groups") or {}).items()]
    return heads, out


def paired_lines(result: dict) -> list[str]:
    lines = []
    for name, t in _summaries(result):
        for key, d in (t.get("paired") or {}).items():
            ci = d.get("ci")
            line = f"{name}: {key} {_num(d.get('diff'), '{:+.3f}')}" + (f" [{ci[0]:+.3f},{ci[1]:+.3f}]" if ci else "")
            if "mcnemar_p" in d:
                line += f"; {d['a_only']} vs {d['b_only']} discordant, McNemar p={d['mcnemar_p']:.3g}"
            lines.append(line)
    return lines


def condition_lines(result: dict) -> list[str]:
    """Retention, floor-normalised retention and gap closed of every cache condition other than
    ``transferred`` (whose ratios are the table's columns): plain reuse, recompute and frontier points."""
    return [
        f"{name}: {cond} " + ", ".join(f"{label} {_num(row.get(k))}" for k, label in RATIOS.items())
        for name, t in _summaries(result)
        for cond, row in (t.get("by_condition") or {}).items()
        if cond != "transferred"
    ]


def _header(result: dict) -> list[str]:
    s, t, m = result["source"], result["target"], result["mapping"]
    lines = [
        f"source {s['name']} ({s['layers']} layers) -> target {t['name']} ({t['layers']} layers); "
        f"mapping {m.get('path') or m.get('name')}",
        f"conditions: {', '.join(result['conditions'])}; accuracy [Wilson 95%]; ratios [paired bootstrap 95%, "
        f"{result['settings']['bootstrap']} resamples]",
    ]
    fr = result.get("frontier")
    if fr:
        lines.append(
            f"frontier at R = {', '.join(f'{r:g}' for r in fr['ratios'])}, {fr['sink']} sink tokens: truncated@R = the "
            "target's own prefill of the sinks and the last ceil(R*P) context tokens only (original positions); "
            "tail@R = those rows computed by the target over the mapped cache of the rest"
        )
    return lines


def terminal_table(result: dict) -> str:
    from kvbridge.evaluate.report import text_table

    heads, body = rows(result)
    out = _header(result) + ["", *text_table(heads, body, right=False, strip=True)]
    extra = condition_lines(result)
    if extra:
        out += ["", "the other cache conditions (point values):"] + ["  " + x for x in extra]
    out += ["", "paired differences (a - b, per item):"] + ["  " + x for x in paired_lines(result)]
    out += [f"note: {n}" for n in result.get("notes") or []]
    return "\n".join(out)


def markdown(result: dict) -> str:
    from kvbridge.evaluate.report import md_table

    heads, body = rows(result)
    table = md_table(
        heads, [[c.strip() if i else c.replace("  ", "&nbsp;&nbsp;") for i, c in enumerate(r)] for r in body]
    )
    out = [f"- {x}" for x in _header(result)] + ["", *table, ""]
    extra = condition_lines(result)
    if extra:
        out += ["The other cache conditions (point values):", ""] + [f"- {x}" for x in extra] + [""]
    out += ["Paired differences (a - b, per item):", ""] + [f"- {x}" for x in paired_lines(result)]
    out += [f"- note: {n}" for n in result.get("notes") or []]
    return "\n".join(out) + "\n"


def to_json(result: dict) -> str:
    return json.dumps(result, indent=1, allow_nan=False)


def plot(result: dict, path: Path) -> bool:
    """Accuracy per task (and overall) per condition, Wilson intervals as error bars; False (no file)
    where matplotlib is not installed."""
    from kvbridge.evaluate.report import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return False
    conds = list(result["conditions"])
    names, data = zip(*_summaries(result))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(names) * max(1, len(conds)) / 3), 3.6))
    width = 0.8 / max(1, len(conds))
    for j, c in enumerate(conds):
        bars = {i: t["conditions"].get(c) or {} for i, t in enumerate(data)}
        bars = {i: row for i, row in bars.items() if row.get("accuracy") is not None}  # task index -> row
        xs = [i + (j - (len(conds) - 1) / 2) * width for i in bars]
        ys = [row["accuracy"] for row in bars.values()]
        cis = [row.get("ci") or [row["accuracy"]] * 2 for row in bars.values()]
        lo = [max(0.0, y - ci[0]) for y, ci in zip(ys, cis)]
        hi = [max(0.0, ci[1] - y) for y, ci in zip(ys, cis)]
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=c)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy (Wilson 95%)")
    ax.legend(fontsize=7, ncols=min(3, len(conds)))
    return save_figure(plt, fig, path)


def write_report(result: dict, folder) -> dict:
    """``harness.json``, ``summary.md`` and ``accuracy.png`` in ``folder``: built beside it and renamed
    into place (it replaces only an earlier kvbridge harness report, never a folder of anything else)."""
    from kvbridge.artifacts import atomic_dir

    folder = Path(folder)
    with atomic_dir(folder, kind=REPORT_KIND, overwrite=True, flag="") as tmp:
        (tmp / "harness.json").write_text(to_json(result) + "\n", encoding="utf-8")
        (tmp / "summary.md").write_text(markdown(result), encoding="utf-8")
        plotted = plot(result, tmp / "accuracy.png")
    names = ("harness.json", "summary.md") + (("accuracy.png",) if plotted else ())
    return {name: folder / name for name in names}
