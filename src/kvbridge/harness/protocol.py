"""What a harness task is: the items it builds, how a completion is scored (torch-free).

A task is a class with these members (checked when it registers, like a fitter)::

    @dataclass(frozen=True)
    class MyOptions:                      # every option, typed, with its default
        n: int = 20

    class MyTask:
        name = "mytask"
        Options = MyOptions
        no_context = True                 # is the no-context condition meaningful here?
        executes_code = False             # does scoring run generated code (needs --allow-code-execution)?

        def items(self, options, tokenizer) -> list[GenItem | ChoiceItem]: ...
        def score(self, item, completion: str) -> float: ...   # generation items: 0..1
        def chance(self, item) -> float: ...                    # what guessing scores on this item

A task may also define ``answer(answerer, condition, item) -> (score, shown)`` to answer and score
an item itself through :class:`kvbridge.harness.conditions.Answerer` (the lm-eval tasks do).

Items are frozen dataclasses holding text. Every condition sees the same token ids: the
``context`` (what the cache holds: the target's own prefill, the source's through the mapping,
...) and the ``query`` fed live after it. A :class:`GenItem` is answered by greedy decoding
(``max_new_tokens``, cut at the first ``stop`` string) and scored by the task; a
:class:`ChoiceItem` is answered by log-likelihood: the choice with the highest summed log
probability after context + query wins (exact match with ``gold``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from kvbridge.errors import KVBridgeError

from kvbridge.plugin_types import TASK_MEMBERS, task_problem  # noqa: F401  (checked when it registers)


class HarnessError(KVBridgeError):
    """A harness run that cannot go as asked (unknown task, code execution not allowed, ...)."""


@dataclass(frozen=True)
class GenItem:
    """A generation item: the target continues ``context + query`` greedily."""

    id: str
    context: str
    query: str
    answer: Any
    max_new_tokens: int = 16
    stop: tuple = ("\n",)
    group: str = ""  # e.g. "len=256 pos=0.50": results are also reported per group
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class ChoiceItem:
    """A multiple-choice item scored by log-likelihood of each choice after ``context + query``."""

    id: str
    context: str
    query: str
    choices: tuple
    gold: int
    group: str = ""
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@runtime_checkable
class TaskProtocol(Protocol):
    name: str
    Options: type

    def items(self, options: Any, tokenizer: Any) -> list: ...

    def score(self, item: Any, completion: str) -> float: ...

    def chance(self, item: Any) -> float: ...


__all__ = ["GenItem", "ChoiceItem", "TaskProtocol", "HarnessError", "task_problem", "TASK_MEMBERS"]
