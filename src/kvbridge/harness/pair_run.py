"""``kvbridge harness`` as one library call: :func:`harness_run` (a :class:`~kvbridge.run.Run`: a loaded
pair + :class:`HarnessSettings` -> result; :func:`harness_pair` makes the run of a pair).

:func:`prepare` does every check that needs no model (task names and options, lm-eval tasks,
code execution, the mapping folder, a replaceable report folder), so a command can fail before
loading anything; :func:`harness_run` calls it when not given its result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvbridge.harness.protocol import HarnessError
from kvbridge.harness.settings import HarnessSettings


@dataclass(frozen=True)
class Prepared:
    tasks: tuple  # LoadedTask records of the registered tasks
    lm_specs: tuple  # resolved lm-eval task specs
    lm_options: dict  # -o lm-eval:NAME.key=value options


def prepare(settings: HarnessSettings) -> Prepared:
    """Everything about ``settings`` that can be refused before a model loads."""
    from kvbridge.harness.lm_eval_tasks import lm_eval_task_specs
    from kvbridge.harness.run import code_tasks, load_tasks, parse_task_options

    options = parse_task_options(settings.task_options)
    lm_options = {k: options.pop(k) for k in [k for k in options if k.startswith("lm-eval:")]}
    tasks = load_tasks(list(settings.tasks), options) if settings.tasks else []
    # resolved (and refused when hub-only) before any model loads
    lm_specs = lm_eval_task_specs(list(settings.lm_eval_tasks), include_path=settings.lm_eval_include)
    if lm_options and not lm_specs:
        raise HarnessError(
            f"-o names {next(iter(lm_options))!r}, which is not an --lm-eval-task",
            "add the task with --lm-eval-task, or drop the option",
        )
    code_tasks(tasks, settings.allow_code_execution)
    if settings.mapping != "identity" and not (Path(settings.mapping) / "manifest.json").is_file():
        raise HarnessError(
            f"--mapping {settings.mapping}: not a mapping folder (no manifest.json)",
            "pass a folder written by `kvbridge fit SRC TGT --out DIR`, or identity",
        )
    if settings.report_dir:
        from kvbridge.artifacts import check_replaceable
        from kvbridge.harness.report import REPORT_KIND

        check_replaceable(settings.report_dir, REPORT_KIND, overwrite=True, flag="")
    return Prepared(tuple(tasks), tuple(lm_specs), lm_options)


def harness_run(run, *, prepared: Prepared | None = None, progress: Callable[[int, int], None] | None = None):
    """Run the tasks of ``run.settings`` (a :class:`HarnessSettings`) on ``run.pair``.

    Returns ``(result, written)``: the JSON-ready result, and the report files written (empty
    without ``report_dir``). Finished items go to ``settings.partial_file`` as they finish (removed
    once a report is written beside it)."""
    from kvbridge.evaluate.run import mapping_of, write_and_close
    from kvbridge.harness.report import write_report
    from kvbridge.harness.run import run_tasks
    from kvbridge.progress import PartialLog

    settings, src, tgt = run.settings, run.source, run.target
    prepared = prepared or prepare(settings)
    mapping = mapping_of(run)  # checked against the run's model identities (computed once)
    tasks = list(prepared.tasks)
    if prepared.lm_specs:
        from kvbridge.harness.lm_eval_tasks import lm_eval_loaded_tasks

        tasks += lm_eval_loaded_tasks(list(prepared.lm_specs), prepared.lm_options)
    partial = on_item = None
    if settings.partial_file is not None:
        head = {"command": "harness", "source": src.name, "target": tgt.name, "mapping": settings.mapping}
        partial = PartialLog(settings.partial_file, {**head, "tasks": [t.name for t in tasks]})
        on_item = lambda task, record: partial.add({"task": task, **record})  # noqa: E731
    result = run_tasks(run, tasks, mapping, progress=progress, on_item=on_item)
    return result, write_and_close(result, settings, write_report, partial)


def harness_pair(pair, settings: HarnessSettings, *, prepared: Prepared | None = None, progress=None, host=None):
    """:func:`harness_run` of ``settings`` on a loaded :class:`~kvbridge.models.pair.ModelPair`."""
    from kvbridge.run import Run

    return harness_run(Run.of(pair, settings, host), prepared=prepared, progress=progress)
