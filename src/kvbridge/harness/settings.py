"""What ``kvbridge harness`` (and :func:`kvbridge.harness.pair_run.harness_pair`) is asked to do.

A frozen value with the CLI's defaults; malformed values are refused here, as one-line
:class:`~kvbridge.harness.protocol.HarnessError` naming the option and the fix, so the Python API
gets the same checks as the command line. No torch, no models, no task registry: checks that need
the registry (task names, code execution, lm-eval tasks) are :func:`kvbridge.harness.pair_run.prepare`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbridge.errors import names_value, whole_number
from kvbridge.harness.protocol import HarnessError


def _names(value, flag: str) -> tuple:
    return names_value(value, flag, HarnessError)


@dataclass(frozen=True)
class HarnessSettings:
    """``mapping``: a mapping folder or ``"identity"``; ``tasks``: registered task names;
    ``task_options``: ``TASK.KEY=VALUE`` strings; ``lm_eval_tasks``: lm-evaluation-harness task names
    or YAML files (``lm_eval_include``: a folder of task YAMLs); ``conditions``: empty = every one
    that applies; ``recompute_layers`` / ``recompute_tokens``: extra transferred points with part of
    the cache recomputed; ``frontier``: ``R[,R...]`` shares of the context for the compute frontier's
    ``truncated@R`` / ``tail@R`` conditions, ``sink`` sink tokens they keep; ``limit``: items per task (0: all); ``report_dir`` / ``partial_path``: where
    the report and the finished items go; ``accept_fingerprint_mismatch``: warn instead of refusing."""

    mapping: str
    tasks: tuple = ()
    task_options: tuple = ()
    lm_eval_tasks: tuple = ()
    lm_eval_include: str | None = None
    conditions: tuple = ()
    recompute_layers: str | None = None
    recompute_tokens: str | None = None
    frontier: str | None = None
    sink: int = 4
    limit: int = 0
    allow_code_execution: bool = False
    bootstrap: int = 1000
    seed: int = 0
    report_dir: str | None = None
    partial_path: str | None = None
    accept_fingerprint_mismatch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.mapping, str) or not self.mapping.strip():
            raise HarnessError("--mapping is empty", "pass a mapping folder from `kvbridge fit`, or identity")
        for name, flag in (
            ("tasks", "--tasks"),
            ("conditions", "--conditions"),
            ("lm_eval_tasks", "--lm-eval-task"),
            ("task_options", "-o"),
        ):
            object.__setattr__(
                self,
                name,
                _names(getattr(self, name), flag)
                if name != "task_options"
                else tuple(str(v) for v in (self.task_options or ())),
            )
        if not self.tasks and not self.lm_eval_tasks:
            raise HarnessError("no tasks given", "pass --tasks recall (or mc, humaneval) and/or --lm-eval-task NAME")
        for value, flag in (
            (self.limit, "--limit"),
            (self.bootstrap, "--bootstrap"),
            (self.seed, "--seed"),
            (self.sink, "--sink"),
        ):
            whole_number(value, flag, 0, HarnessError)
        if self.frontier is not None:
            self.frontier_ratios  # a typo fails before anything is loaded (one line, naming --frontier)

    @property
    def frontier_ratios(self) -> tuple[float, ...]:
        """``frontier`` as sorted shares of the context (``"0.1,25%"`` -> ``(0.1, 0.25)``); () when not asked."""
        from kvbridge.evaluate.settings import parse_frontier

        return parse_frontier(self.frontier) if self.frontier is not None else ()

    @property
    def partial_file(self) -> str | None:
        """Where finished items go: ``partial_path``, or ``REPORT.partial.jsonl`` beside a report."""
        if self.partial_path is None and self.report_dir:
            return str(self.report_dir).rstrip("/\\") + ".partial.jsonl"
        return self.partial_path


__all__ = ["HarnessSettings"]
