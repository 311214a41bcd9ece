"""In-context recall: synthetic key-value facts that exist only in the context.

The context is a list of made-up facts (``The code for velmora is 48213.``: random keys made of
syllables, random 5-digit values, drawn from a seeded generator), grown fact by fact until it
holds ``length`` target tokens; the asked fact sits at relative ``position`` (0 = first, 1 =
last) among them. The live query asks for it (``Question: What is the code for velmora?`` /
``Answer: The code for velmora is``) and the first run of digits the model writes is compared
with the value (exact match).

The value is drawn uniformly from 90,000 numbers and appears nowhere but in the context, so the
no-context control is near zero by construction (chance 1/90,000): a transferred cache that
scores above it carries the fact. Items come in cells of (length, position); each cell is a
report group (``len=256 pos=0.50``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from kvbridge.harness.protocol import GenItem, HarnessError

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gl", "kr", "pl", "st")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "n", "r", "l", "s", "x", "m")
HEADER = "Below is a list of secret codes. Each code belongs to one name.\n"
VALUES = (10000, 99999)


@dataclass(frozen=True)
class RecallOptions:
    lengths: str = "256,1024"  # context lengths in target tokens (comma-separated)
    positions: str = "0.1,0.5,0.9"  # relative position of the asked fact (0 first .. 1 last)
    n: int = 4  # items per (length, position) cell
    seed: int = 0
    max_new_tokens: int = 8


def _numbers(text: str, kind, name: str) -> list:
    try:
        out = [kind(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise HarnessError(
            f"recall option {name}={text!r} is not a comma-separated list of numbers",
            f"pass e.g. -o recall.{name}=256,1024",
        ) from None
    if not out:
        raise HarnessError(f"recall option {name} is empty", f"pass e.g. -o recall.{name}=256,1024")
    return out


def _key(rng: random.Random) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(rng.choice((2, 3))))


def fact(key: str, value: int) -> str:
    return f"The code for {key} is {value}.\n"


class RecallTask:
    """Exact-match recall of one synthetic key-value fact from the context (no-context chance ~0)."""

    name = "recall"
    Options = RecallOptions
    no_context = True
    executes_code = False

    def items(self, options: RecallOptions, tokenizer) -> list:
        lengths = _numbers(options.lengths, int, "lengths")
        positions = _numbers(options.positions, float, "positions")
        if any(x < 32 for x in lengths):
            raise HarnessError(
                f"recall context lengths must be at least 32 tokens, got {options.lengths!r}",
                "pass e.g. -o recall.lengths=256,1024",
            )
        if any(not 0 <= p <= 1 for p in positions):
            raise HarnessError(
                f"recall positions must be in [0, 1], got {options.positions!r}",
                "pass e.g. -o recall.positions=0.1,0.5,0.9",
            )
        if options.n < 1:
            raise HarnessError(f"recall option n={options.n} must be at least 1", "pass e.g. -o recall.n=4")
        rng = random.Random(options.seed)
        header = len(tokenizer(HEADER, add_special_tokens=False)["input_ids"])
        out = []
        for length in lengths:
            for pos in positions:
                for i in range(options.n):
                    facts, used, size, last = [], set(), header, 0
                    while size < length or len(facts) < 2:
                        key = _key(rng)
                        if key in used:
                            continue
                        used.add(key)
                        value = rng.randint(*VALUES)
                        line = fact(key, value)
                        facts.append((key, value, line))
                        last = len(tokenizer(line, add_special_tokens=False)["input_ids"])
                        size += last
                    if len(facts) > 2 and abs(size - last - length) < abs(size - length):
                        facts.pop()  # the last fact pushed it over: dropped, that stays closer to the length
                    at = min(len(facts) - 1, int(round(pos * (len(facts) - 1))))
                    key, value, _ = facts[at]
                    out.append(
                        GenItem(
                            id=f"recall-{length}-{pos:.2f}-{i}",
                            context=HEADER + "".join(line for *_, line in facts),
                            query=f"Question: What is the code for {key}?\nAnswer: The code for {key} is",
                            answer=str(value),
                            max_new_tokens=options.max_new_tokens,
                            stop=("\n", "."),
                            group=f"len={length} pos={pos:.2f}",
                            meta={"facts": len(facts), "index": at, "length": length, "position": pos},
                        )
                    )
        return out

    def score(self, item: GenItem, completion: str) -> float:
        m = re.search(r"\d+", completion)
        return float(m is not None and m.group(0) == item.answer)

    def chance(self, item) -> float:
        return 1.0 / (VALUES[1] - VALUES[0] + 1)
