"""Contrastive pairs for steering vectors: reading, rendering, token positions.

A pairs file is JSONL, one pair per line::

    {"positive": "I loved every [[minute]] of it.", "negative": "I hated every [[minute]] of it."}
    {"positive": [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Name a fruit."}],
     "negative": [{"role": "user", "content": "Name a fruit."}]}

Each side is a plain text or a list of chat turns (``role`` / ``content``). Chat turns are
rendered with the model's chat template (``add_generation_prompt=True``: the text ends where the
assistant's answer would begin); a tokenizer without a template renders them as
``role: content`` lines (recorded as ``"plain"`` in the vector's manifest). Plain texts are encoded
as they are, with the tokenizer's special tokens.

Where a side is read (:func:`token_span`):

- ``last``: the last position a prompt's *cache* holds: the second-to-last token. A prompt handed
  to generation keeps its final token out of the cache (:mod:`kvbridge.handoff`: the model consumes
  it to produce the first new token), so ``kvbridge steer run`` edits that position; reading the
  vector there keeps building and applying at the same token of the template.
- ``final``: the text's very last token.
- ``span``: the mean over a marked span, ``[[`` ... ``]]`` (markers removed before encoding).
  Its ends follow the exact-token split rules (:mod:`kvbridge.prefix.splits`): the text before
  the span must encode to exactly the leading ids of the whole text (and the same for the span's
  end), or the pair is refused: a marker inside a token would read the wrong tokens.

Bad input (not JSON, a line without both sides, empty text, turns without role/content, no
span marker with ``span``, an empty file) is a one-line :class:`PairsError` naming the line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbridge.errors import KVBridgeError
from kvbridge.prefix.splits import encode, special_affixes, strip_suffix

POSITIONS = ("last", "final", "span")
OPEN, CLOSE = "[[", "]]"
#: the largest pairs file read (a steering set is hundreds of short pairs)
MAX_PAIRS_BYTES = 32 << 20


class PairsError(KVBridgeError):
    """A contrastive pairs file is malformed, empty, or a pair cannot be encoded."""


@dataclass(frozen=True)
class Pair:
    positive: Any  # str or tuple of (role, content)
    negative: Any
    line: int


@dataclass(frozen=True)
class Encoded:
    """One side of a pair as token ids, with the positions the vector reads."""

    ids: tuple
    start: int  # first position read
    stop: int  # one past the last position read
    text: str


def _side(value: Any, where: str) -> Any:
    if isinstance(value, str):
        if not value.strip():
            raise PairsError(f"{where} is an empty text", "give every pair a non-empty positive and negative text")
        return value
    if isinstance(value, list) and value:
        turns = []
        for i, turn in enumerate(value):
            if not (
                isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str)
            ):
                raise PairsError(
                    f"{where} turn {i} is not {{'role': str, 'content': str}}",
                    "write chat turns as objects with a role and a content",
                )
            turns.append((turn["role"], turn["content"]))
        if not any(c.strip() for _, c in turns):
            raise PairsError(f"{where} has only empty turns", "give the turns some content")
        return tuple(turns)
    raise PairsError(
        f"{where} must be a non-empty text or a non-empty list of chat turns, got {type(value).__name__}",
        'write e.g. {"positive": "...", "negative": "..."}',
    )


def read_pairs(path: str | Path) -> list[Pair]:
    """Every pair of a JSONL file (blank lines and lines starting with ``#`` skipped)."""
    from kvbridge.check.validate import json_depth, utf8_text

    path = Path(path)
    try:
        if path.is_dir():
            raise PairsError(f"pairs file {path} is a folder", "pass a JSONL file of contrastive pairs")
        size = path.stat().st_size
        if size > MAX_PAIRS_BYTES:
            raise PairsError(f"pairs file {path} is {size} bytes (limit {MAX_PAIRS_BYTES})", "pass a smaller file")
        text = utf8_text(path.read_bytes(), str(path))
    except OSError as exc:
        raise PairsError(
            f"cannot read pairs file {path}: {exc.strerror or exc}", "pass a readable JSONL file"
        ) from None
    pairs = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{n}"
        if json_depth(line) > 8:
            raise PairsError(f"{where} is nested too deeply", "write one flat JSON object per line")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PairsError(
                f"{where} is not JSON ({exc.msg} at column {exc.colno})",
                'write one JSON object per line: {"positive": ..., "negative": ...}',
            ) from None
        if not isinstance(obj, dict) or "positive" not in obj or "negative" not in obj:
            raise PairsError(
                f"{where} needs the keys 'positive' and 'negative'",
                'write one JSON object per line: {"positive": ..., "negative": ...}',
            )
        pairs.append(Pair(_side(obj["positive"], f"{where} positive"), _side(obj["negative"], f"{where} negative"), n))
    if not pairs:
        raise PairsError(
            f"pairs file {path} has no pairs", "write one JSON object per line with 'positive' and 'negative'"
        )
    return pairs


def pairs_digest(pairs: list[Pair]) -> str:
    """sha256 of the pairs' canonical JSON (recorded in the vector's manifest)."""

    def side(value):  # a text, or chat turns as [role, content] lists
        return value if isinstance(value, str) else [list(t) for t in value]

    data = [[side(p.positive), side(p.negative)] for p in pairs]
    return hashlib.sha256(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


# -- rendering -------------------------------------------------------------------------------------
def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render(tokenizer: Any, side: Any, *, generation_prompt: bool = True) -> str:
    """The text of one side: a plain text as is; chat turns through the chat template (or plain lines)."""
    if isinstance(side, str):
        return side
    turns = [{"role": r, "content": c} for r, c in side]
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(turns, add_generation_prompt=generation_prompt, tokenize=False)
    return "".join(f"{r}: {c}\n" for r, c in side)


def template_kind(tokenizer: Any, pairs: list[Pair]) -> str:
    """``"none"`` (plain texts only), ``"chat"`` (the model's template) or ``"plain"`` (turns as lines)."""
    if all(isinstance(p.positive, str) and isinstance(p.negative, str) for p in pairs):
        return "none"
    return "chat" if has_chat_template(tokenizer) else "plain"


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of a whole text: with the tokenizer's special tokens, unless the text already begins with
    its BOS (chat templates that write it themselves)."""
    bos = getattr(tokenizer, "bos_token", None)
    return encode(tokenizer, text, add_special_tokens=not (bool(bos) and text.startswith(bos)))


def _head_length(tokenizer: Any, text: str, at: int, joint: list[int], where: str) -> int:
    """How many leading ids of ``joint`` encode ``text[:at]`` (the leading special tokens for ``at == 0``);
    refused when the text before ``at`` does not encode to exactly those ids (an exact split)."""
    prefix, suffix = special_affixes(tokenizer)
    if at <= 0:
        return len(prefix)
    head = strip_suffix(encode(tokenizer, text[:at], add_special_tokens=True), suffix)
    tail = encode(tokenizer, text[at:], add_special_tokens=False) if at < len(text) else []
    if head + tail + list(suffix) != joint:
        raise PairsError(
            f"{where}: the span boundary at character {at} falls inside a token "
            f"(text before it does not encode to the leading ids of the whole text)",
            "move the [[ ]] marker to a word boundary (e.g. before the space, not after it)",
        )
    return len(head)


def encode_side(tokenizer: Any, side: Any, position: str, where: str = "pair") -> Encoded:
    """Token ids of one side and the positions a vector reads there (see the module docstring)."""
    if position not in POSITIONS:
        raise PairsError(f"unknown position {position!r}", f"use one of: {', '.join(POSITIONS)}")
    text = render(tokenizer, side)
    if position != "span":
        if OPEN in text and CLOSE in text:
            text = text.replace(OPEN, "").replace(CLOSE, "")
        ids = encode_text(tokenizer, text)
        if position == "last":
            if len(ids) < 2:
                raise PairsError(
                    f"{where} encodes to {len(ids)} token(s); 'last' reads the second-to-last token",
                    "use longer texts or --position final",
                )
            return Encoded(tuple(ids), len(ids) - 2, len(ids) - 1, text)
        if not ids:
            raise PairsError(f"{where} encodes to no tokens", "use longer texts")
        return Encoded(tuple(ids), len(ids) - 1, len(ids), text)
    a, b = text.find(OPEN), text.find(CLOSE)
    if a < 0 or b < a or text.count(OPEN) != 1 or text.count(CLOSE) != 1:
        raise PairsError(f"{where} has no single [[...]] span", "mark the span to read with [[ and ]] (once per text)")
    clean = text[:a] + text[a + len(OPEN) : b] + text[b + len(CLOSE) :]
    end = b - len(OPEN)
    if end <= a:
        raise PairsError(f"{where} has an empty [[...]] span", "put at least one word between [[ and ]]")
    ids = encode_text(tokenizer, clean)
    start, stop = (_head_length(tokenizer, clean, at, ids, where) for at in (a, end))
    stop = stop if end < len(clean) else len(ids)
    if stop <= start:
        raise PairsError(f"{where}: the span covers no token", "widen the [[ ]] span")
    return Encoded(tuple(ids), start, stop, clean)
