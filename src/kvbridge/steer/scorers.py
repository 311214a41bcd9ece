"""Built-in behaviour scorers: deterministic functions ``text -> bool`` (regex, lexicons, a JSON parser).

A scorer says whether one sampled continuation (decoded, cut at the end-of-turn token) shows a
behaviour. No model judges anything. Registered by ``kvbridge.builtin.steering``; plugins add
their own through ``kvbridge_register_scorers`` (contract: :class:`kvbridge.testing.ScorerContract`).
Each built-in is the function of its name, described in ``_DESCRIPTIONS`` (what ``kvbridge plugins``
shows); the sentiment scorers count the words of a small fixed lexicon (:data:`POSITIVE`, :data:`NEGATIVE`).
"""

from __future__ import annotations

import json
import re

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_+-]*\s*\n?")
_BULLET = re.compile(r"^\s*[-*\u2022]\s+\S", re.M)
_WORD = re.compile(r"[a-z']+")
_BLOCK = re.compile(r"```[A-Za-z0-9_+-]*\n(.*?)(?:```|\Z)", re.S)
_COMMENT = re.compile(r"^\s*(?:#(?![!#])\s*\S|//\s*\S)|\s#\s+\S|\s//\s+\S|\"\"\"|'''", re.M)

POSITIVE = frozenset(
    """
love loved lovely loving sweet fair gentle kind joy joyful happy happily glad good great wonderful excellent
delightful delicious amazing beautiful best blessed dear brilliant pleasant perfect fantastic enjoy enjoyed
enjoyable favorite favourite friendly grateful honest hope merry noble peace pleasure smile warm charming
""".split()
)
NEGATIVE = frozenset(
    """
hate hated hateful bad terrible awful horrible worst disgusting rude dirty cold bland boring poor sad angry
death dead die dies kill killed blood bloody curse cursed woe grief foul villain murder war fear evil cruel
pain painful disappointing disappointed disappointment unpleasant nasty wrong ugly miserable slow stale
""".split()
)


def _unfence(text: str) -> str:
    return _FENCE.sub("", text, count=1).lstrip()


def json_object(text: str) -> bool:
    body = _unfence(text)
    if not body.startswith("{"):
        return False
    try:
        value, _end = json.JSONDecoder().raw_decode(body)
    except (json.JSONDecodeError, RecursionError):
        return False
    return isinstance(value, dict)


def json_start(text: str) -> bool:
    return bool(re.match(r"\{\s*[\"}]", _unfence(text)))


def bullets(text: str) -> bool:
    return len(_BULLET.findall(text)) >= 2


def _polarity(text: str) -> tuple[int, int]:
    words = _WORD.findall(text.lower())
    return sum(w in POSITIVE for w in words), sum(w in NEGATIVE for w in words)


def positive_sentiment(text: str) -> bool:
    pos, neg = _polarity(text)
    return pos >= 1 and pos > neg


def negative_sentiment(text: str) -> bool:
    pos, neg = _polarity(text)
    return neg >= 1 and neg > pos


def code_comments(text: str) -> bool:
    blocks = _BLOCK.findall(text)
    return bool(_COMMENT.search("\n".join(blocks) if blocks else text))


#: name -> description of each built-in scorer (the function of that name here)
_DESCRIPTIONS = {
    "json_object": "the answer starts with a complete JSON object (json.JSONDecoder; a code fence is skipped)",
    "json_start": "the answer starts a JSON object: '{' then '\"' or '}' (truncated objects count)",
    "bullets": "at least two lines start with a bullet (-, *, \u2022 and a space)",
    "positive_sentiment": "more positive than negative lexicon words, at least one",
    "negative_sentiment": "more negative than positive lexicon words, at least one",
    "code_comments": "a # or // comment or a docstring inside the code (fenced blocks when present)",
}
BUILTIN_SCORERS = tuple((name, text, f"kvbridge.steer.scorers:{name}") for name, text in _DESCRIPTIONS.items())
