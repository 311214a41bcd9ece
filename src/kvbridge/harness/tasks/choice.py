"""Multiple choice from a local JSONL file, scored by log-likelihood (bring your own task).

One JSON object per line::

    {"question": "Which planet is largest?", "choices": ["Mars", "Jupiter", "Venus"], "answer": 1}
    {"context": "Tom has 3 apples.", "question": "How many apples?", "choices": ["2", "3"], "answer": "3"}

``answer`` is the index of the right choice or its text; ``context`` (optional) is a passage put
before the question; ``id`` (optional) names the item. The cache holds
``[context]\\nQuestion: <question>\\n``; the live part is ``Answer:`` and then each choice (with a
leading space); the choice with the highest summed log probability is the model's answer. Chance
is 1/k per item; the no-context condition scores the choices after ``Answer:`` alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvbridge.harness.protocol import ChoiceItem, HarnessError


@dataclass(frozen=True)
class ChoiceOptions:
    path: str = ""  # the JSONL file (required)
    question_prefix: str = "Question: "
    answer_prefix: str = "Answer:"


def read_items(path: str, options: ChoiceOptions | None = None) -> list[ChoiceItem]:
    """The items of a multiple-choice JSONL file; a malformed line is a one-line error naming it."""
    options = options or ChoiceOptions(path=path)
    p = Path(path)
    if not str(path):
        raise HarnessError("the mc task needs a JSONL file", "pass -o mc.path=FILE.jsonl")
    if not p.is_file():
        raise HarnessError(f"multiple-choice file not found: {p}", "pass -o mc.path=FILE.jsonl (an existing file)")
    out = []
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise HarnessError(f"{where} is not JSON ({exc.msg})", "write one JSON object per line") from None
            if not isinstance(rec, dict):
                raise HarnessError(f"{where} is not a JSON object", "write one JSON object per line")
            q, choices, ans = rec.get("question"), rec.get("choices"), rec.get("answer")
            if (
                not isinstance(q, str)
                or not isinstance(choices, list)
                or len(choices) < 2
                or not all(isinstance(c, str) and c.strip() for c in choices)
            ):
                raise HarnessError(
                    f"{where} needs 'question' (text) and 'choices' (two or more non-empty texts)",
                    'write e.g. {"question": "...", "choices": ["a", "b"], "answer": 0}',
                )
            index = isinstance(ans, int) and not isinstance(ans, bool)
            gold = ans if index else (choices.index(ans) if isinstance(ans, str) and ans in choices else -1)
            if not 0 <= gold < len(choices):
                raise HarnessError(
                    f"{where}: answer {ans!r} is not one of its {len(choices)} choices (by index or by text)",
                    "set answer to 0..k-1 or to one of the choices",
                )
            ctx = rec.get("context") or ""
            if not isinstance(ctx, str):
                raise HarnessError(f"{where}: 'context' must be text", "drop it or make it a string")
            context = (ctx.rstrip() + "\n" if ctx.strip() else "") + f"{options.question_prefix}{q.strip()}\n"
            out.append(
                ChoiceItem(
                    id=str(rec.get("id", f"mc-{lineno}")),
                    context=context,
                    query=options.answer_prefix,
                    choices=tuple(" " + c.strip() for c in choices),
                    gold=gold,
                    group=str(rec.get("group", "")),
                )
            )
    if not out:
        raise HarnessError(f"{p} holds no items", "write one JSON object per line")
    return out


class ChoiceTask:
    """Multiple choice from a local JSONL file (log-likelihood of each choice; chance 1/k)."""

    name = "mc"
    Options = ChoiceOptions
    no_context = True
    executes_code = False

    def items(self, options: ChoiceOptions, tokenizer) -> list:
        return read_items(options.path, options)

    def score(self, item, completion: str) -> float:  # pragma: no cover - choice items are scored by log-likelihood
        raise HarnessError("multiple-choice items are scored by log-likelihood", "report this as a bug")

    def chance(self, item: ChoiceItem) -> float:
        return 1.0 / len(item.choices)
