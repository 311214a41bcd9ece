"""``kvbridge split``: joint encoding, naive split and exact-token (safe) split of guide + sep + live."""

from __future__ import annotations

import json

import click


def unescape(sep: str) -> str:
    """``\\n``, ``\\t``, ``\\r`` and ``\\\\`` in a separator given on the command line."""
    out, i = [], 0
    table = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "s": " "}
    while i < len(sep):
        ch = sep[i]
        if ch == "\\" and i + 1 < len(sep) and sep[i + 1] in table:
            out.append(table[sep[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


@click.command("split")
@click.argument("tokenizer")
@click.option("--guide", required=True, help="Guide text (the hidden prefix), or @FILE.")
@click.option("--live", required=True, help="Live text that follows the guide, or @FILE.")
@click.option("--sep", default=" ", show_default=True,
              help="Separator between guide and live text (\\n, \\t, \\s escapes).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def split(tokenizer: str, guide: str, live: str, sep: str, as_json: bool) -> None:
    """Where may a hidden prefix end so that ghost + live == joint, id for id?

    TOKENIZER is a model or tokenizer folder, a tokenizer.json, a vocab.json (+ merges.txt) or
    a SentencePiece tokenizer.model. Reports the joint encoding of GUIDE + SEP + LIVE, the naive
    split (GUIDE + SEP and LIVE encoded apart) and a safe split found by backing up from the
    append point to a boundary whose re-encoded tail reproduces the joint ids; says so when none
    exists. The ghost carries the tokenizer's BOS, the live part never does.
    """
    from kvbridge.prefix.splits import load_tokenizer, read_text_arg, split_text

    guide_text = read_text_arg(guide, "guide")
    live_text = read_text_arg(live, "live")
    tok = load_tokenizer(tokenizer)
    report = split_text(tok, guide_text, live_text, unescape(sep))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
        return
    for line in report.lines():
        click.echo(line)


def open_guide_session(model: str, tokenizer: str | None, guide: str, prompt: str, dtype: str):
    """``(model, tokenizer, guide_text, prompt_text)`` for the commands that run a guide + prompt:
    texts read (``@FILE`` allowed), an empty guide refused, the model folder opened."""
    from kvbridge.prefix.packs import open_model_dir, require_model_dir
    from kvbridge.prefix.splits import SplitError, load_tokenizer, read_text_arg

    guide_text = read_text_arg(guide, "guide")
    prompt_text = read_text_arg(prompt, "prompt")
    if not guide_text.strip():
        raise SplitError("the guide is empty", "pass a non-empty --guide TEXT (or @FILE)")
    require_model_dir(model)
    tok = load_tokenizer(tokenizer or model)
    return open_model_dir(model, dtype=dtype), tok, guide_text, prompt_text
