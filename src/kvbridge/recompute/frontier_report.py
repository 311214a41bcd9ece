"""The table, markdown and files of ``kvbridge eval --frontier`` (:mod:`kvbridge.recompute.frontier`)."""

from __future__ import annotations

from kvbridge.evaluate.report import fmt, fmt_ci, md_table, text_table

COLS = (
    "condition",
    "R",
    "rows",
    "FLOPs target",
    "FLOPs source",
    "gap_recovered [95% CI]",
    "- source [95% CI]",
    "- truncated@R [95% CI]",
    "kl_p95",
    "top1",
)


def gap_diff_text(d) -> str:
    """A paired difference's gap recovered and its interval, e.g. ``+0.120 [+0.050, +0.190]``."""
    if not d:
        return ""
    return f"{fmt(d.get('gap_diff'), '{:+.3f}')} {fmt_ci(d.get('gap_diff_ci'), '{:+.3f}')}"


def rows(result: dict) -> list[list[str]]:
    return [
        [
            cond,
            fmt(r.get("ratio"), "{:g}") if r.get("ratio") is not None else "",
            str(r["rows_computed"]) if r.get("rows_computed") is not None else "",
            fmt(r.get("flop_share"), "{:.3f}"),
            fmt(r.get("source_flop_share"), "{:.3f}"),
            f"{fmt(r.get('gap_recovered'), '{:+.3f}')} {fmt_ci(r.get('gap_recovered_ci'), '{:+.3f}')}",
            gap_diff_text(r.get("vs_source")),
            gap_diff_text(r.get("vs_truncated")),
            fmt(r.get("kl_p95"), "{:.4f}"),
            fmt(r.get("top1_agreement"), "{:.3f}"),
        ]
        for cond, r in result["conditions"].items()
    ]


def verdict_line(result: dict) -> str:
    return f"verdict: {result['verdict']['text']}"


def table(result: dict) -> str:
    head = (
        f"frontier: {result['samples']} samples, prefix {result['prefix_len']}, continuation "
        f"{result['continuation_len']}, sink {result['sink']}, positions {result['positions']}"
    )
    return "\n".join([head, *text_table(COLS, rows(result)), "", verdict_line(result)])


def markdown(result: dict) -> str:
    out = ["# The compute frontier", "", *md_table(COLS, rows(result)), "", f"**{verdict_line(result)}**", ""]
    return "\n".join(out + ["Notes:"] + [f"- {n}" for n in result.get("notes") or []]) + "\n"


def write(result: dict, folder) -> dict:
    """``frontier.json`` and ``frontier.md`` in ``folder`` (each written atomically)."""
    from kvbridge.recompute.report import write_files

    return write_files(folder, "frontier", result, markdown(result))
