"""``kvbridge harness`` as one library call: :func:`harness_pair` (a loaded pair + settings -> result).

:func:`prepare` does every check that needs no model (task names and options, lm-eval tasks,
code execution, the mapping folder, a replaceable report folder), so a command can fail before
loading anything; :func:`harness_pair` calls it when not given its result.
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
    from kvbridge.harness.run import load_tasks, parse_task_options

    options = parse_task_options(settings.task_options)
    lm_options = {k: options.pop(k) for k in [k for k in options if k.startswith("lm-eval:")]}
    tasks = load_tasks(list(settings.tasks), options) if settings.tasks else []
    lm_specs = []
    if settings.lm_eval_tasks:  # resolved (and refused when hub-only) before any model loads
        from kvbridge.harness.lm_eval_tasks import lm_eval_task_specs

        lm_specs = lm_eval_task_specs(list(settings.lm_eval_tasks), include_path=settings.lm_eval_include)
    if lm_options and not lm_specs:
        raise HarnessError(
            f"-o names {next(iter(lm_options))!r}, which is not an --lm-eval-task",
            "add the task with --lm-eval-task, or drop the option",
        )
    needs_exec = [t.name for t in tasks if getattr(t.task, "executes_code", False)]
    if needs_exec and not settings.allow_code_execution:
        raise HarnessError(
            f"task {needs_exec[0]!r} runs model-generated code and code execution is not allowed",
            "pass --allow-code-execution (it runs in a limited subprocess, not a container)",
        )
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


def harness_pair(
    pair,
    settings: HarnessSettings,
    *,
    prepared: Prepared | None = None,
    progress: Callable[[int, int], None] | None = None,
    host=None,
) -> tuple[dict, dict]:
    """Run the tasks of ``settings`` on a loaded :class:`~kvbridge.models.pair.ModelPair`.

    Returns ``(result, written)``: the JSON-ready result, and the report files written (empty
    without ``report_dir``). Finished items go to ``settings.partial_file`` as they finish (removed
    once a report is written beside it)."""
    from kvbridge.evaluate.run import load_mapping_ref
    from kvbridge.harness.conditions import parse_recompute_layers, parse_recompute_tokens
    from kvbridge.harness.report import write_report
    from kvbridge.harness.run import run_harness
    from kvbridge.progress import PartialLog

    prepared = prepared or prepare(settings)
    src, tgt = pair.source, pair.target
    mapping = load_mapping_ref(
        settings.mapping, src.model, tgt.model, tokenizer=pair.tokenizer, force=settings.accept_fingerprint_mismatch
    )
    layers = tgt.spec.num_layers if getattr(tgt, "spec", None) else tgt.model.config.num_hidden_layers
    points = parse_recompute_layers(settings.recompute_layers, layers) + parse_recompute_tokens(
        settings.recompute_tokens
    )
    tasks = list(prepared.tasks)
    if prepared.lm_specs:
        from kvbridge.harness.lm_eval_tasks import lm_eval_loaded_tasks

        tasks += lm_eval_loaded_tasks(list(prepared.lm_specs), prepared.lm_options)
    partial_file = settings.partial_file
    partial = (
        None
        if partial_file is None
        else PartialLog(
            partial_file,
            {
                "command": "harness",
                "source": src.name,
                "target": tgt.name,
                "mapping": settings.mapping,
                "tasks": [t.name for t in tasks],
            },
        )
    )

    def on_item(task, record):
        if partial is not None:
            partial.add({"task": task, **record})

    result = run_harness(
        src.model,
        tgt.model,
        mapping,
        tgt.tokenizer,
        tasks,
        conditions=list(settings.conditions) or None,
        recompute=points,
        frontier=settings.frontier_ratios,
        sink=settings.sink,
        allow_code_execution=settings.allow_code_execution,
        bootstrap=settings.bootstrap,
        seed=settings.seed,
        limit=settings.limit,
        progress=progress,
        on_item=on_item,
        source_name=src.name,
        target_name=tgt.name,
        host=host,
        mapping_info={
            "path": None if settings.mapping == "identity" else str(settings.mapping),
            "name": getattr(mapping, "name", type(mapping).__name__),
            "exact": bool(getattr(mapping, "exact", False)),
        },
    )
    written = {}
    if settings.report_dir:
        written = write_report(result, settings.report_dir)
        if partial is not None and settings.partial_path is None:
            partial.remove()
            partial = None
    if partial is not None:
        partial.finish()
    return result, written


__all__ = ["Prepared", "prepare", "harness_pair"]
