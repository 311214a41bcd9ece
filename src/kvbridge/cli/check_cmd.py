"""``kvbridge check SRC TGT``: the compatibility report of a (source, target) pair.

Config-only: imports neither torch nor transformers (a test asserts it).
"""

from __future__ import annotations

import shutil
import textwrap

import click

from kvbridge.cli.options import fmt_value, json_option
from kvbridge.safe_text import escape

VERDICT_COLOURS = {
    "same": "green",
    "mappable": "yellow",
    "blocking": "red",
    "info": "cyan",
    "warning": "magenta",
    "identity": "green",
    "rope-reapply": "green",
    "incompatible": "red",
}


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 3)] + "..."


def render(report, *, strict: bool = False, width: int | None = None) -> str:
    """The human-readable report: one row per axis, its action below, then verdict and reasons."""
    width = width or max(60, min(120, shutil.get_terminal_size((100, 24)).columns))
    rows = [
        (a.name, fmt_value(a.name, a.source), fmt_value(a.name, a.target), a.verdict, a.action) for a in report.axes
    ]
    col = max(26, (width - 16 - 12) // 2)
    w_name = max(len(r[0]) for r in rows)
    w_src = min(col, max(len("source"), *(len(r[1]) for r in rows)))
    w_tgt = min(col, max(len("target"), *(len(r[2]) for r in rows)))
    title = f"{report.source_name or report.source.model_type} -> {report.target_name or report.target.model_type}"
    lines = [
        click.style(escape(title), bold=True),
        "",
        click.style(f"  {'axis':<{w_name}}  {'source':<{w_src}}  {'target':<{w_tgt}}  verdict", bold=True),
    ]
    wrapper = textwrap.TextWrapper(width=width, initial_indent=" " * (w_name + 4), subsequent_indent=" " * (w_name + 4))
    for name, src, tgt, verdict, action in rows:
        lines.append(
            f"  {name:<{w_name}}  {_clip(src, w_src):<{w_src}}  {_clip(tgt, w_tgt):<{w_tgt}}  "
            + click.style(verdict, fg=VERDICT_COLOURS.get(verdict), bold=verdict == "blocking")
        )
        lines.extend(click.style(line, dim=True) for line in wrapper.wrap(action))
    lines += ["", "verdict: " + click.style(report.verdict, fg=VERDICT_COLOURS.get(report.verdict), bold=True)]
    reason_wrap = textwrap.TextWrapper(width=width, initial_indent="  - ", subsequent_indent="    ")
    lines += [line for reason in report.reasons for line in reason_wrap.wrap(reason)]
    for measured in report.measured:  # kvbridge's own results on this very pair
        head, *rest = measured.lines(width)
        lines += ["", click.style(head, fg="magenta", bold=True), *rest]
    if strict:
        failures = report.strict_failures()
        verdict = f"strict: fails ({'; '.join(failures)})" if failures else "strict: passes"
        lines.append(click.style(verdict, fg="red" if failures else "green"))
    return "\n".join(lines)


@click.command("check")
@click.argument("source", metavar="SRC")
@click.argument("target", metavar="TGT")
@json_option(help="Print the report as JSON: {source, target, axes, verdict, reasons, measured}.")
@click.option(
    "--strict",
    is_flag=True,
    help="Fail (exit 1) unless the transfer is exact (identity or rope-reapply) and every "
    "other axis is same: a dtype cast, an attention or cache-format difference, an "
    "unknown or partly matching tokenizer, or a plugin warning fails.",
)
@click.option(
    "--source-tokenizer",
    metavar="PATH",
    help="Tokenizer folder or file to fingerprint for SRC (overrides the files beside its config).",
)
@click.option("--target-tokenizer", metavar="PATH", help="Tokenizer folder or file to fingerprint for TGT.")
def check(
    source: str, target: str, as_json: bool, strict: bool, source_tokenizer: str | None, target_tokenizer: str | None
) -> None:
    """Report whether the KV cache of SRC can become a cache of TGT, and how.

    SRC and TGT are each a model folder (save_pretrained), a .gguf file (or a folder holding
    one), a config.json, a hub id already in the local Hugging Face cache (never downloaded),
    a name from manifests (`kvbridge describe --list`), zoo:NAME, a short name such as smollm2
    (`kvbridge models`), or SCHEME:REST for schemes plugins register. Weight files are
    compared by the sha256 of every byte (cached by size and mtime).

    One row per axis (model, layers, kv_heads, head_dim, positional, rope, attention,
    dtype, cache_format, tokenizer, then plugin findings), each with a verdict
    (same / mappable / blocking) and what a transfer must do. The overall verdict is
    identity (reuse as is), rope-reapply (strip the source RoPE, apply the target's),
    mappable (a fitted mapping is needed) or incompatible. Where kvbridge has measured a transfer on
    this very pair (manifests/results/), its verdict follows: each number beside the source model
    alone and the command that produced it.

    Exit status: 0 when a transfer is possible, 1 when incompatible (or --strict fails),
    2 on bad input (unreadable config, unknown model, no KV cache).
    """
    from kvbridge.models.compat import check_models

    report = check_models(source, target, source_tokenizer=source_tokenizer, target_tokenizer=target_tokenizer)
    if as_json:
        click.echo(report.to_json())
        if strict and report.ok and report.strict_failures():
            click.echo("strict: fails (" + "; ".join(report.strict_failures()) + ")", err=True)
    else:
        click.echo(render(report, strict=strict))
    click.get_current_context().exit(report.exit_code(strict=strict))
