"""``kvbridge harness``: task accuracy from a transferred cache (retention, gap closed, intervals)."""

from __future__ import annotations

import click

from kvbridge.cli.numbers import SEED, THREADS, count
from kvbridge.cli.options import dtype_option, json_option


def _task_help() -> str:
    from kvbridge.builtin.tasks import TASKS

    return "\n".join(f"    {t.name}: {t.description}" for t in TASKS)


@click.command("harness")
@click.argument("source")
@click.argument("target")
@click.option(
    "--mapping",
    "mapping_ref",
    required=True,
    help="Mapping folder written by `kvbridge fit` for this pair, or 'identity' (same content geometry).",
)
@click.option(
    "--tasks",
    "task_names",
    default="",
    metavar="NAME[,NAME...]",
    help="Registered tasks to run (built-ins below; plugins add more).",
)
@click.option(
    "-o",
    "--task-option",
    "task_options",
    multiple=True,
    metavar="TASK.KEY=VALUE",
    help="A task option, e.g. -o recall.lengths=256,1024 -o mc.path=q.jsonl -o lm-eval:NAME.num_fewshot=2. Repeatable.",
)
@click.option(
    "--lm-eval-task",
    "lm_eval_tasks",
    multiple=True,
    metavar="NAME|YAML",
    help="An lm-evaluation-harness task (a name, or a task YAML file) scored through the same conditions. "
    "Repeatable. Tasks whose data is on the hub need local files offline.",
)
@click.option(
    "--lm-eval-include",
    "lm_eval_include",
    default=None,
    type=click.Path(exists=True, file_okay=False),
    help="A folder of lm-eval task YAMLs (lm-eval's --include_path).",
)
@click.option(
    "--conditions",
    default="",
    metavar="C[,C...]",
    help="Conditions (default: every one that applies): target, source, transferred, plain, no_context, "
    "and the recompute points.",
)
@click.option(
    "--recompute-layers",
    default=None,
    metavar="SPEC[;SPEC...]",
    help="Also run the transferred cache with these target layers recomputed: 3,7-9 | all | 10% "
    "(the first 10% of the layers, the cheapest in target mode). ';' separates points.",
)
@click.option(
    "--recompute-tokens",
    default=None,
    metavar="R[,R...]",
    help="Also run the transferred cache with a share R of the context tokens recomputed (CacheBlend rule).",
)
@click.option(
    "--frontier",
    default=None,
    metavar="R[,R...]",
    help="Also run the compute frontier's points for each share R of the context: truncated@R (the target "
    "prefills only --sink first tokens and the last ceil(R*P), at their original positions; no transfer) and "
    "tail@R (those rows computed by the target over the mapped cache of the rest), as in `kvbridge eval --frontier`.",
)
@click.option(
    "--sink", default=4, show_default=True, type=count(0), help="Sink tokens (the context's first) kept by --frontier."
)
@click.option("--limit", default=0, type=count(0), show_default=True, help="Items per task (0: all the task builds).")
@click.option(
    "--allow-code-execution",
    is_flag=True,
    help="Let tasks that run model-generated code (humaneval) do so, in a limited subprocess "
    "(timeout, CPU/memory/file limits, temporary folder, clean environment). Not a container.",
)
@click.option("--bootstrap", default=1000, show_default=True, type=count(0), help="Paired bootstrap resamples.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the bootstrap.")
@dtype_option
@click.option("--threads", default=None, type=THREADS, help="torch threads (default: torch's choice).")
@json_option(help="Print the result as JSON.")
@click.option(
    "--report",
    "report_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Write harness.json, summary.md and accuracy.png to this folder.",
)
@click.option(
    "--partial",
    "partial_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="JSONL of finished items, rewritten atomically after each (default with --report: "
    "REPORT.partial.jsonl, removed once the report is written).",
)
@click.option(
    "--accept-fingerprint-mismatch",
    "accept_mismatch",
    is_flag=True,
    help="Use a mapping whose fingerprints do not match the models (warns instead of refusing).",
)
def harness(
    source,
    target,
    mapping_ref,
    task_names,
    task_options,
    lm_eval_tasks,
    lm_eval_include,
    conditions,
    recompute_layers,
    recompute_tokens,
    frontier,
    sink,
    limit,
    allow_code_execution,
    bootstrap,
    seed,
    dtype,
    threads,
    as_json,
    report_dir,
    partial_path,
    accept_mismatch,
):
    """Does the target still solve the task from a transferred cache?

    SOURCE and TARGET are model references sharing a tokenizer (see `kvbridge describe --help`).
    Each task item's context is prefilled (by the target: 'target'; by the source, which answers
    itself: 'source'; by the source, moved by --mapping: 'transferred'; by the source, given
    as it is: 'plain', where the geometry allows), then the target answers the live query
    from that cache; 'no_context' answers the query alone. Per task and overall: accuracy with
    Wilson 95% intervals, retention (transferred / target), floor-normalised retention (above
    the task's chance level), gap closed ((transferred - source) / (target - source)) and paired
    differences between conditions (bootstrap intervals, McNemar). --frontier R adds truncated@R
    and tail@R (paired against source and tail@R against truncated@R).

    \b
    TASKS
    """
    from kvbridge.threads import passive_omp_wait

    passive_omp_wait()  # before torch loads: waiting threads sleep (a shared machine, BENCHMARKS.md)
    from kvbridge.harness.pair_run import harness_pair, prepare
    from kvbridge.harness.settings import HarnessSettings

    settings = HarnessSettings(
        mapping=mapping_ref,
        tasks=task_names,
        task_options=task_options,
        lm_eval_tasks=lm_eval_tasks,
        lm_eval_include=lm_eval_include,
        conditions=conditions,
        recompute_layers=recompute_layers,
        recompute_tokens=recompute_tokens,
        frontier=frontier,
        sink=sink,
        limit=limit,
        allow_code_execution=allow_code_execution,
        bootstrap=bootstrap,
        seed=seed,
        report_dir=report_dir,
        partial_path=partial_path,
        accept_fingerprint_mismatch=accept_mismatch,
    )
    prepared = prepare(settings)  # every refusal that needs no model, before loading one
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if threads:
        torch.set_num_threads(int(threads))
    from kvbridge.cli.options import load_pair
    from kvbridge.harness.report import terminal_table, to_json
    from kvbridge.progress import Progress

    pair = load_pair(source, target, dtype=dtype)
    bar = None

    def progress(done, total):
        nonlocal bar
        if bar is None:
            bar = Progress(total, label="harness", unit="items", enabled=True)
        bar.update(done)

    result, written = harness_pair(pair, settings, prepared=prepared, progress=progress)
    if bar is not None:
        bar.close()
    if written and not as_json:
        click.echo(f"report: {', '.join(str(p) for p in written.values())}", err=True)
    click.echo(to_json(result) if as_json else terminal_table(result))


harness.help = harness.help.replace(
    "TASKS", "Built-in tasks (-o TASK.key=value sets their options):\n" + _task_help(), 1
)
