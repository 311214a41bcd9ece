"""What ``kvbridge harness`` (and :func:`kvbridge.harness.pair_run.harness_run`) is asked to do.

A frozen value; each field declares its command-line option (:mod:`kvbridge.settings_fields`: the
command's options are generated from it); malformed values are refused here, as one-line
:class:`~kvbridge.harness.protocol.HarnessError` naming the option and the fix, so the Python API
gets the same checks as the command line. No torch, no models, no task registry: checks that need
the registry (task names, code execution, lm-eval tasks) are :func:`kvbridge.harness.pair_run.prepare`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbridge.errors import names_value
from kvbridge.evaluate.settings import frontier_ratios
from kvbridge.harness.protocol import HarnessError
from kvbridge.settings_fields import (
    MAPPING_FIX,
    bootstrap_option,
    check_kinds,
    mismatch_option,
    nonempty,
    option,
    partial_file,
    partial_option,
    report_option,
    seed_option,
)


@dataclass(frozen=True)
class HarnessSettings:
    """One ``kvbridge harness`` run; each field's help is its option's (``tasks``, ``conditions``: name
    lists, ``"a,b"`` or a sequence; empty ``conditions``: every one that applies)."""

    mapping: str = option(
        help="Mapping folder written by `kvbridge fit` for this pair, or 'identity' (same content geometry).",
        required=True,
    )
    tasks: tuple = option(
        (),
        "Registered tasks to run (built-ins below; plugins add more).",
        cli_default="",
        metavar="NAME[,NAME...]",
    )
    task_options: tuple = option(
        (),
        "A task option, e.g. -o recall.lengths=256,1024 -o mc.path=q.jsonl -o lm-eval:NAME.num_fewshot=2. Repeatable.",
        flags=("-o", "--task-option"),
        multiple=True,
        metavar="TASK.KEY=VALUE",
    )
    lm_eval_tasks: tuple = option(
        (),
        "An lm-evaluation-harness task (a name, or a task YAML file) scored through the same conditions. "
        "Repeatable. Tasks whose data is on the hub need local files offline.",
        flags=("--lm-eval-task",),
        multiple=True,
        metavar="NAME|YAML",
    )
    lm_eval_include: str | None = option(
        None,
        "A folder of lm-eval task YAMLs (lm-eval's --include_path).",
        kind=("path", {"exists": True, "file_okay": False}),
    )
    conditions: tuple = option(
        (),
        "Conditions (default: every one that applies): target, source, transferred, plain, no_context, "
        "and the recompute points.",
        cli_default="",
        metavar="C[,C...]",
    )
    recompute_layers: str | None = option(
        None,
        "Also run the transferred cache with these target layers recomputed: 3,7-9 | all | 10% "
        "(the first 10% of the layers, the cheapest in target mode). ';' separates points.",
        metavar="SPEC[;SPEC...]",
    )
    recompute_tokens: str | None = option(
        None,
        "Also run the transferred cache with a share R of the context tokens recomputed (CacheBlend rule).",
        metavar="R[,R...]",
    )
    frontier: str | None = option(
        None,
        "Also run the compute frontier's points for each share R of the context: truncated@R (the target "
        "prefills only --sink first tokens and the last ceil(R*P), at their original positions; no transfer) and "
        "tail@R (those rows computed by the target over the mapped cache of the rest), as in `kvbridge eval "
        "--frontier`.",
        metavar="R[,R...]",
    )
    sink: int = option(4, "Sink tokens (the context's first) kept by --frontier.", kind=("count", 0), show_default=True)
    limit: int = option(0, "Items per task (0: all the task builds).", kind=("count", 0), show_default=True)
    allow_code_execution: bool = option(
        False,
        "Let tasks that run model-generated code (humaneval) do so, in a limited subprocess "
        "(timeout, CPU/memory/file limits, temporary folder, clean environment). Not a container.",
        flag=True,
    )
    bootstrap: int = bootstrap_option()
    seed: int = seed_option("Seed of the bootstrap.")
    report_dir: str | None = report_option("Write harness.json, summary.md and accuracy.png to this folder.")
    partial_path: str | None = partial_option("items")
    accept_fingerprint_mismatch: bool = mismatch_option()

    def __post_init__(self) -> None:
        nonempty(self.mapping, "--mapping", MAPPING_FIX, HarnessError)
        for name, flag in (("tasks", "--tasks"), ("conditions", "--conditions"), ("lm_eval_tasks", "--lm-eval-task")):
            object.__setattr__(self, name, names_value(getattr(self, name), flag, HarnessError))
        object.__setattr__(self, "task_options", tuple(str(v) for v in (self.task_options or ())))
        if not self.tasks and not self.lm_eval_tasks:
            raise HarnessError("no tasks given", "pass --tasks recall (or mc, humaneval) and/or --lm-eval-task NAME")
        check_kinds(self, HarnessError)  # --sink, --limit, --bootstrap, --seed
        frontier_ratios(self)  # a typo fails before anything is loaded (one line, naming --frontier)

    frontier_ratios = property(frontier_ratios)
    partial_file = property(partial_file)
