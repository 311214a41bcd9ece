"""``kvbridge harness``: task accuracy from a transferred cache (retention, gap closed, intervals)."""

from __future__ import annotations

import click

from kvbridge.cli.options import dtype_option, json_option, settings_from, settings_options, threads_option
from kvbridge.harness.settings import HarnessSettings


@click.command("harness")
@click.argument("source")
@click.argument("target")
@settings_options(
    HarnessSettings, after={"seed": [dtype_option, threads_option, json_option(help="Print the result as JSON.")]}
)
def harness(source, target, dtype, threads, as_json, **options):
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
    from kvbridge.harness.pair_run import harness_run, prepare

    settings = settings_from(HarnessSettings, options)
    prepared = prepare(settings)  # every refusal that needs no model, before loading one
    from kvbridge.cli.options import echo_written, load_pair, quiet_torch

    quiet_torch(threads)
    from kvbridge.harness.report import terminal_table, to_json
    from kvbridge.progress import Progress
    from kvbridge.run import Run

    pair = load_pair(source, target, dtype=dtype)
    bar = None

    def progress(done, total):
        nonlocal bar
        if bar is None:
            bar = Progress(total, label="harness", unit="items", enabled=True)
        bar.update(done)

    result, written = harness_run(Run.of(pair, settings), prepared=prepared, progress=progress)
    if bar is not None:
        bar.close()
    echo_written(written, as_json)
    click.echo(to_json(result) if as_json else terminal_table(result))


from kvbridge.builtin.tasks import TASKS  # noqa: E402 - the built-in tasks, listed in --help

harness.help = harness.help.replace(
    "TASKS",
    "Built-in tasks (-o TASK.key=value sets their options):\n"
    + "\n".join(f"    {t.name}: {t.description}" for t in TASKS),
    1,
)
