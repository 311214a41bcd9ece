"""Presenting an evaluation: the terminal table, JSON, and the ``--report DIR`` folder.

``--report DIR`` writes:

- ``summary.md``: the table of every condition, the gates, the transferred-vs-condition NLL
  differences with intervals, the per-layer attention cosine, the definitions and notes;
- ``eval.json``: the same result as ``--json``;
- ``attention_cosine.png``: attention-output cosine per target layer, one line per condition
  with a cache, with 95% bootstrap intervals;
- ``gap_recovered.png``: gap recovered per condition with 95% intervals;
- ``mapping_r2.png``: the mapping's held-out R² per (target layer, KV head), K and V, when the
  mapping has them (fitted mappings do; the identity does not).

Plots need matplotlib; without it the Markdown says the plots were skipped and why.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvbridge.evaluate.catalog import BUILTIN_METRICS

#: the columns of the terminal table: (metric, header, format), from the one metric list
COLUMNS = tuple((m.name, m.column, m.fmt) for m in BUILTIN_METRICS if m.column)


def fmt(value, spec: str = "{:.3f}") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return spec.format(value)


def fmt_ci(ci, spec: str = "{:.3f}") -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    return f"[{spec.format(ci[0])}, {spec.format(ci[1])}]"


#: the metrics the table and the report give with their 95% intervals
INTERVALS = ("nll", "gap_recovered", "kl_p95", "top1_agreement", "attention_cosine_min")


def _with_ci(row: dict, metric: str) -> str:
    return f"{fmt(row.get(metric), '{:.4f}')} {fmt_ci(row.get(metric + '_ci'), '{:.4f}')}"


def text_table(heads, rows, *, right: bool = True, strip: bool = False) -> list[str]:
    """Aligned lines: the heads, a rule, the rows (the first column left-aligned, the others right-aligned
    unless ``right`` is False; trailing blanks dropped if ``strip``)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]

    def line(cells):
        text = "  ".join(c.rjust(w) if i and right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return text.rstrip() if strip else text

    return [line(heads), "-" * len(line(heads))] + [line(r) for r in rows]


def md_table(heads, rows) -> list[str]:
    """A Markdown table's lines."""
    return ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)] + ["| " + " | ".join(r) + " |" for r in rows]


def _header(result: dict) -> str:
    src, tgt = result["source"], result["target"]
    mp = result.get("mapping") or {}
    where = f" ({mp['path']})" if mp.get("path") else ""
    return (
        f"{src.get('name') or 'source'} -> {tgt.get('name') or 'target'}  mapping {mp.get('name')}{where}; "
        f"{result['samples']} samples, prefix {result['prefix_len']}, continuation {result['continuation_len']}, "
        f"greedy {result['greedy_tokens']}; {result['bootstrap']} paired bootstrap resamples"
    )


def table_rows(result: dict) -> list[list[str]]:
    return [[cond] + [fmt(row.get(m), f) for m, _, f in COLUMNS] for cond, row in result["conditions"].items()]


def terminal_table(result: dict) -> str:
    """The readable table of every condition plus gates and comparisons."""
    heads = ["condition"] + [h for _, h, _ in COLUMNS]
    out = [_header(result), ""] + text_table(heads, table_rows(result))
    conds = result["conditions"]
    if "transferred" in conds:
        t = conds["transferred"]
        out += ["", "transferred, 95% intervals: " + "; ".join(f"{m} {_with_ci(t, m)}" for m in INTERVALS)]
        parts = []
        for name, c in (result.get("comparisons") or {}).items():
            d, (lo, hi) = fmt(c.get("nll_diff"), "{:+.4f}"), c.get("nll_diff_ci") or [None, None]
            verdict = "" if lo is None or hi is None else " better" if hi < 0 else " worse" if lo > 0 else " tie"
            parts.append(f"{name.removeprefix('transferred_vs_')} {d} {fmt_ci([lo, hi], '{:+.4f}')}{verdict}")
        if parts:
            out.append("nll(transferred) - nll(x): " + "; ".join(parts))
    gates = result.get("gates") or []
    if gates:
        enforced = any(g["enforced"] for g in gates)
        shown = "; ".join(
            f"{g['gate']} = {fmt(g['value'], '{:.4f}')} {'PASS' if g['passed'] else 'FAIL'}"
            + ("" if g["enforced"] or not enforced else " (not enforced)")
            for g in gates
        )
        out += ["", f"gates{'' if enforced else ' (reported; enforce with --gate)'}: {shown}"]
    tm = result.get("timing") or {}
    if tm.get("transfer_ms") is not None:
        out.append(
            f"timing: target prefill {fmt(tm.get('target_prefill_ms'), '{:.1f}')} ms, transfer "
            f"{fmt(tm.get('transfer_ms'), '{:.1f}')} ms for {tm.get('prefix_tokens')} prefix tokens; "
            f"eval {fmt(tm.get('eval_seconds'), '{:.1f}')} s"
        )
        if tm.get("transfer_speedup_vs_prefill") is not None:
            out.append(
                f"speed-up: {fmt(tm.get('transfer_speedup_vs_prefill'), '{:.1f}')}x (target prefill / transfer), "
                f"{fmt(tm.get('transfer_speedup_with_source_prefill'), '{:.2f}')}x counting the source prefill "
                f"({fmt(tm.get('source_prefill_ms'), '{:.1f}')} ms; target prefill / (source prefill + transfer))"
            )
    return "\n".join(out + [f"note: {note}" for note in result.get("notes") or []])


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2, sort_keys=False, allow_nan=False)


# -- the report folder -------------------------------------------------------------------------------
def pyplot():
    """matplotlib's ``pyplot`` on the Agg backend (files only), or None where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(plt, fig, path, dpi: int = 110, layout: bool = True) -> bool:
    """Write ``fig`` to ``path`` (laid out first unless ``layout`` is False) and close it."""
    if layout:
        fig.tight_layout()
    fig.savefig(str(path), dpi=dpi)
    plt.close(fig)
    return True


def plot_attention(result: dict, path: Path, plt) -> bool:
    conds = {c: r for c, r in result["conditions"].items() if r.get("attention_cosine_layers")}
    if not conds:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for c, r in conds.items():
        ys = r["attention_cosine_layers"]
        xs = list(range(len(ys)))
        ax.plot(xs, ys, marker="o", label=c, linewidth=2.5 if c == "transferred" else 1.2)
        ci = r.get("attention_cosine_layers_ci")
        if ci:
            ax.fill_between(xs, [a for a, _ in ci], [b for _, b in ci], alpha=0.15)
    gate = next((g for g in result.get("gates") or [] if g["metric"] == "attention_cosine_min"), None)
    if gate:
        ax.axhline(gate["threshold"], color="k", linestyle="--", linewidth=0.8, label=f"gate {gate['threshold']:g}")
    ax.set_xlabel("target layer")
    ax.set_ylabel("attention-output cosine vs native")
    ax.set_title("Attention-output cosine per target layer (95% CI)")
    ax.set_xticks(range(max(len(r["attention_cosine_layers"]) for r in conds.values())))
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(alpha=0.3)
    return save_figure(plt, fig, path)


def plot_gap(result: dict, path: Path, plt) -> bool:
    items = [(c, r.get("gap_recovered"), r.get("gap_recovered_ci")) for c, r in result["conditions"].items()]
    items = [(c, v, ci) for c, v, ci in items if v is not None]
    if not items:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = list(range(len(items)))
    vals = [v for _, v, _ in items]
    lows = [ci[0] if ci and ci[0] is not None else v for _, v, ci in items]
    lo = [v - low for v, low in zip(vals, lows)]
    hi = [(ci[1] if ci and ci[1] is not None else v) - v for _, v, ci in items]
    colors = ["tab:green" if c == "native" else "tab:blue" if c == "transferred" else "tab:gray" for c, _, _ in items]
    ax.bar(xs, vals, color=colors, alpha=0.7)
    ax.errorbar(xs, vals, yerr=[lo, hi], fmt="none", ecolor="k", capsize=4)
    ax.axhline(1.0, color="tab:green", linestyle="--", linewidth=0.8)
    ax.axhline(0.0, color="k", linewidth=0.8)
    floor = -2.0  # far below "no prefix" the exact value matters little: clip, and print it
    ax.set_ylim(max(floor, min(lows + [0.0]) - 0.1), max(1.25, max(v + h for v, h in zip(vals, hi)) + 0.1))
    for x, v, low in zip(xs, vals, lows):
        if low < floor:
            label = f"{v:+.2f}\n(CI to {low:.1f})"
            ax.annotate(label, (x, floor), xytext=(0, 6), textcoords="offset points", ha="center", fontsize=7)
    ax.set_xticks(xs)
    ax.set_xticklabels([c for c, _, _ in items], rotation=30, ha="right")
    ax.set_ylabel("gap recovered (1 = native, 0 = no prefix)")
    ax.set_title("Gap recovered per condition (95% paired bootstrap CI)")
    ax.grid(axis="y", alpha=0.3)
    return save_figure(plt, fig, path)


def plot_r2(result: dict, path: Path, plt) -> bool:
    r2 = (result.get("mapping") or {}).get("heldout_r2") or {}
    if not r2.get("k") or not r2.get("v"):
        return False
    fig, axes = plt.subplots(1, 2, figsize=(8, 4))
    for ax, kind in zip(axes, ("k", "v")):
        data = r2[kind]  # [target layers][heads]
        grid = [[x if x is not None else float("nan") for x in row] for row in data]
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_title(f"held-out R², {kind.upper()}")
        ax.set_xticks(range(len(data[0]) if data else 0))
        ax.set_yticks(range(len(data)))
        ax.set_xlabel("target KV head")
        ax.set_ylabel("target layer")
        for i, row in enumerate(data):
            for j, x in enumerate(row):
                if x is not None and len(data) * len(row) <= 64:
                    ax.text(j, i, f"{x:.2f}", ha="center", va="center", fontsize=7, color="w" if x < 0.6 else "k")
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.suptitle("Mapping held-out R² per (target layer, KV head)")
    return save_figure(plt, fig, path, layout=False)


def markdown(result: dict, images: dict, skipped: str | None = None) -> str:
    heads = ["condition"] + [h for _, h, _ in COLUMNS]
    out = ["# kvbridge eval", "", _header(result), ""] + md_table(heads, table_rows(result))
    cells = [[c, *(_with_ci(r, m) for m in INTERVALS)] for c, r in result["conditions"].items()]
    out += ["", "## 95% paired bootstrap intervals", ""] + md_table(("condition", *INTERVALS), cells)
    comps = result.get("comparisons") or {}
    if comps:
        out += ["", "## nll(transferred) − nll(condition), same samples", ""]
        rows = [
            [
                name.removeprefix("transferred_vs_"),
                fmt(c.get("nll_diff"), "{:+.4f}"),
                fmt_ci(c.get("nll_diff_ci"), "{:+.4f}"),
            ]
            for name, c in comps.items()
        ]
        out += md_table(("condition", "difference", "95% CI"), rows)
    gates = result.get("gates") or []
    if gates:
        rows = [
            [
                f"`{g['gate']}`",
                fmt(g["value"], "{:.4f}"),
                "PASS" if g["passed"] else "FAIL",
                "yes" if g["enforced"] else "no",
            ]
            for g in gates
        ]
        out += ["", "## Gates", ""] + md_table(("gate", "value", "result", "enforced"), rows)
    layered = {
        c: r["attention_cosine_layers"] for c, r in result["conditions"].items() if r.get("attention_cosine_layers")
    }
    if layered:
        heads = ["condition"] + [f"L{i}" for i in range(max(len(v) for v in layered.values()))]
        out += ["", "## Attention-output cosine per target layer", ""]
        out += md_table(heads, [[c] + [fmt(x, "{:.4f}") for x in v] for c, v in layered.items()])
    mp = result.get("mapping") or {}
    if mp.get("r2_summary"):
        s = mp["r2_summary"]
        out += [
            "",
            f"Mapping held-out R²: mean {fmt(s.get('mean'), '{:.4f}')} (K {fmt(s.get('mean_k'), '{:.4f}')}, "
            f"V {fmt(s.get('mean_v'), '{:.4f}')}), min {fmt(s.get('min'), '{:.4f}')}. "
            "R² does not predict transfer quality across pairs; attention cosine does better.",
        ]
    if images or skipped:
        out += ["", "## Plots", "", *(f"![{title}]({name})" for title, name in images.items())]
        out += [f"Plots skipped: {skipped}."] if skipped else []
    out += [
        "",
        "## Method",
        "",
        "Each sample is P prefix tokens (cached) + C continuation tokens fed by teacher forcing from the cache; "
        "the C next-token predictions are scored. Every condition uses the same samples; intervals are paired "
        "bootstrap resamples of samples. gap_recovered = (NLL_no_prefix − NLL_x)/(NLL_no_prefix − NLL_native). "
        "retention = acc_x/acc_native (teacher-forced next-token accuracy), the papers' definition; it overstates "
        "the benefit (see no_prefix's retention). Attention cosine: the target's queries of the continuation "
        "(captured in the native run) attend over native vs the condition's prefix K/V (continuation K/V and mask "
        "unchanged); cosine of the attention outputs, heads concatenated, mean over positions.",
        "",
        f"Data: {json.dumps(result.get('data') or {})}",
    ]
    defs = result.get("definitions") or {}
    if defs:
        out += ["", "## Metrics", ""] + [f"- `{k}`: {v}" for k, v in defs.items()]
    return "\n".join(out + [f"\nNote: {note}" for note in result.get("notes") or []]) + "\n"


#: the ownership kind of a report folder (see kvbridge.artifacts)
REPORT_KIND = "kvbridge-eval-report"


def write_report(result: dict, folder) -> dict:
    """Write the report folder atomically; returns ``{file kind: path}`` of what was written.

    The folder is built beside ``folder`` and renamed into place; it replaces only an earlier
    kvbridge eval report (never a folder of anything else).
    """
    from kvbridge.artifacts import atomic_dir

    folder = Path(folder)
    names = {"json": "eval.json"}
    with atomic_dir(folder, kind=REPORT_KIND, overwrite=True, flag="") as tmp:
        (tmp / "eval.json").write_text(to_json(result) + "\n", encoding="utf-8")
        plt = pyplot()
        images, skipped = {}, None
        if plt is None:
            skipped = "matplotlib is not installed (pip install matplotlib)"
        else:
            for title, name, fn in (
                ("attention cosine per layer", "attention_cosine.png", plot_attention),
                ("gap recovered", "gap_recovered.png", plot_gap),
                ("mapping R²", "mapping_r2.png", plot_r2),
            ):
                if fn(result, tmp / name, plt):
                    images[title] = name
                    names[name.removesuffix(".png")] = name
        (tmp / "summary.md").write_text(markdown(result, images, skipped), encoding="utf-8")
        names["markdown"] = "summary.md"
    return {k: folder / v for k, v in names.items()}


def batch_record(first: int, last: int, fields: dict) -> dict:
    """A partial-results record of one evaluated batch: per condition, each metric's batch mean."""
    means = {c: {k: float(t.float().mean()) for k, t in named.items() if t.numel()} for c, named in fields.items()}
    return {"samples": [int(first), int(last)], "conditions": means}
