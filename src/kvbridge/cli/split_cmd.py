"""``kvbridge split``: joint encoding, naive split and exact-token (safe) split of guide + sep + live."""

from __future__ import annotations

import click

from kvbridge.cli.options import echo_result, json_option, open_tokenizer, unescape


@click.command("split")
@click.argument("tokenizer")
@click.option("--guide", required=True, help="Guide text (the hidden prefix), or @FILE.")
@click.option("--live", required=True, help="Live text that follows the guide, or @FILE.")
@click.option(
    "--sep", default=" ", show_default=True, help="Separator between guide and live text (\\n, \\t, \\s escapes)."
)
@json_option
def split(tokenizer: str, guide: str, live: str, sep: str, as_json: bool) -> None:
    """Where may a hidden prefix end so that ghost + live == joint, id for id?

    TOKENIZER is a model or tokenizer folder, a tokenizer.json, a vocab.json (+ merges.txt), a
    SentencePiece tokenizer.model, or any model reference (a .gguf file's own tokenizer,
    zoo:NAME, smollm2, ...). Reports the joint encoding of GUIDE + SEP + LIVE, the naive
    split (GUIDE + SEP and LIVE encoded apart) and a safe split found by backing up from the
    append point to a boundary whose re-encoded tail reproduces the joint ids; says so when none
    exists. The ghost carries the tokenizer's BOS, the live part never does.
    """
    from kvbridge.prefix.splits import read_text_arg, split_text

    guide_text = read_text_arg(guide, "guide")
    live_text = read_text_arg(live, "live")
    report = split_text(open_tokenizer(tokenizer), guide_text, live_text, unescape(sep))
    echo_result(report.to_dict(), as_json, report.lines, ensure_ascii=False)
