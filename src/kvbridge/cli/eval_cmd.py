"""``kvbridge eval``: how good is the transferred cache? Native, transferred, no-prefix and controls."""

from __future__ import annotations

import sys

import click

from kvbridge.cli.options import dtype_option, json_option, settings_from, settings_options, threads_option
from kvbridge.evaluate.settings import EvalSettings


@click.command("eval")
@click.argument("source")
@click.argument("target")
@settings_options(
    EvalSettings,
    after={
        "attention": [dtype_option, json_option(help="Print the result as JSON (stable keys; see docs).")],
        "accept_fingerprint_mismatch": [threads_option],
    },
)
def eval_cmd(source, target, dtype, as_json, threads, **options):
    """Measure a transferred cache against the target's own, with floors and controls.

    SOURCE and TARGET are model references (folders, .gguf files, zoo:NAME such as zoo:base,
    smollm2, hub ids in the local Hugging Face cache; see `kvbridge describe --help`) sharing a
    tokenizer. Samples are --samples windows of the corpus's held-out tail
    (the last --heldout-fraction): P prefix tokens are cached, the next C tokens are fed by
    teacher forcing and their next-token predictions scored. Conditions, all on the same
    samples: native (the target's own cache, the ceiling), transferred (SOURCE's cache through
    --mapping), no_prefix (the floor), zeroed, shuffled (another sample's transferred prefix),
    random (noise with the mapped cache's per-layer mean/std), no_rope_reapply (mapped keys
    never re-rotated for the target), source (SOURCE's own continuation).

    Metrics per condition (the built-ins are listed below; plugins add more), each with a
    95% paired bootstrap interval. JSON keys: conditions.<condition>.<metric> and
    <metric>_ci = [low, high]. Default gates (kl_p95<=0.2, attention_cosine_min>=0.9) are
    reported; --gate makes them (or others) set the exit status: 0 pass, 1 fail, 2 bad input.

    \b
    METRICS
    """
    settings = settings_from(EvalSettings, options)  # every check of the options runs here, before anything loads
    from kvbridge.cli.options import echo_written, load_pair, quiet_torch

    quiet_torch(threads)
    from kvbridge.evaluate.report import terminal_table, to_json
    from kvbridge.recompute.eval_run import evaluate_run
    from kvbridge.progress import Heartbeat, Progress
    from kvbridge.run import Run

    hb = click.get_current_context().with_resource(Heartbeat("eval"))  # plain lines in logs, incl. loading
    hb.stage("loading the models")
    pair = load_pair(source, target, dtype=dtype)
    length, bar = settings.sample_len, None

    def progress(done, total):
        nonlocal bar
        if bar is None:
            bar = Progress(int(total or settings.samples), label="eval", unit="samples", enabled=True)
        bar.update(done, tokens=(done - bar.done) * length)
        hb.total = total or hb.total
        hb.set(done)

    run = evaluate_run(
        Run.of(pair, settings),
        progress=progress,
        heartbeat=hb,
        warn=lambda text: click.echo(f"warning: {text}", err=True),
    )
    if bar is not None:
        bar.close()
    echo_written(run.written, as_json)
    table = terminal_table
    if run.frontier or run.recompute:  # a condition set of its own, with its own table and no gates
        from kvbridge.recompute import frontier_report, report

        table = frontier_report.table if run.frontier else report.table
    click.echo(to_json(run.result) if as_json else table(run.result))
    if run.exit_code and not (run.frontier or run.recompute):
        click.echo(f"gates FAILED: {', '.join(run.failed_gates)}", err=True)
        sys.stdout.flush()
        click.get_current_context().exit(run.exit_code)


from kvbridge.evaluate.catalog import help_text  # noqa: E402 - the built-in metrics, listed in --help

eval_cmd.help = eval_cmd.help.replace(
    "METRICS", "Metrics:\n" + "\n".join("    " + line for line in help_text().splitlines()), 1
)
