"""``kvbridge eval``: how good is the transferred cache? Native, transferred, no-prefix and controls."""

from __future__ import annotations

import sys

import click

from kvbridge.cli.numbers import SEED, SHARE, THREADS, count
from kvbridge.cli.options import dtype_option, json_option

from kvbridge.evaluate.run import load_mapping_ref  # noqa: E402,F401 - kept importable here (harness, bench)


def metric_help() -> str:
    from kvbridge.evaluate.catalog import help_text

    return help_text()


@click.command("eval")
@click.argument("source")
@click.argument("target")
@click.option(
    "--mapping",
    "mapping_ref",
    required=True,
    help="Mapping folder written by `kvbridge fit`, or 'identity' (same content geometry).",
)
@click.option(
    "--corpus",
    required=True,
    type=click.Path(exists=True),
    help="Text file, JSONL with 'text' (samples come from its held-out tail), or folder of .py/.txt "
    "(samples come from its held-out files: the mapping's split by path hash).",
)
@click.option("--samples", default=64, show_default=True, type=count(2), help="Held-out samples.")
@click.option("--prefix-len", default=64, show_default=True, type=count(1), help="Cached prefix tokens P.")
@click.option(
    "--continuation-len",
    default=8,
    show_default=True,
    type=count(1),
    help="Continuation tokens C scored by teacher forcing from the cache.",
)
@click.option(
    "--greedy-tokens",
    default=16,
    show_default=True,
    type=count(1),
    help="Greedy tokens G compared with native's (first divergence step).",
)
@click.option(
    "--heldout-fraction",
    default=0.1,
    show_default=True,
    type=SHARE,
    help="Share of the corpus (its end) that samples come from; fit on the rest (`fit` leaves it out by "
    "default: --corpus-heldout). A folder: the share of files held out. Default: the share the mapping "
    "records for this corpus, else 0.1.",
)
@click.option(
    "--conditions", default="all", show_default=True, help="Comma-separated conditions (native is always run)."
)
@click.option("--bootstrap", default=1000, show_default=True, type=count(0), help="Paired bootstrap resamples.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the bootstrap and the random control.")
@click.option("--batch-size", default=16, show_default=True, type=count(1), help="Samples per forward.")
@click.option("--top-k", default=5, show_default=True, type=count(1), help="k of the top-k overlap.")
@click.option("--top-p", default=0.9, show_default=True, type=SHARE, help="Nucleus of the total-variation distance.")
@click.option("--no-attention", is_flag=True, help="Skip the attention-output cosine.")
@dtype_option
@json_option(help="Print the result as JSON (stable keys; see docs).")
@click.option(
    "--report",
    "report_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Write summary.md, eval.json and PNG plots to this folder.",
)
@click.option(
    "--gate",
    "gates",
    multiple=True,
    metavar="NAME=VALUE",
    help="Enforce a gate (exit 1 when it fails): kl_p95=0.2, attention_cosine_min>=0.9, "
    "COND.METRIC<=X, or 'default'. Repeatable.",
)
@click.option(
    "--accept-fingerprint-mismatch",
    "accept_mismatch",
    is_flag=True,
    help="Use a mapping whose fingerprints do not match the models (warns instead of refusing).",
)
@click.option("--threads", default=None, type=THREADS, help="torch threads (default: torch's choice).")
@click.option(
    "--allow-overlap",
    is_flag=True,
    help="Evaluate even when the samples overlap the mapping's calibration text (refused by default).",
)
@click.option(
    "--partial",
    "partial_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="JSONL of finished batches, rewritten atomically after each (default with --report: "
    "REPORT.partial.jsonl, removed once the report is written).",
)
@click.option(
    "--recompute-layers",
    default=None,
    metavar="SPEC",
    help="Recompute these target layers of the transferred cache: 3,7-9 | all | auto:15% (profiled "
    "on the corpus front); ';' separates several points.",
)
@click.option(
    "--recompute-tokens",
    default=None,
    metavar="R[,R...]",
    help="Token-selective recompute of R of the prefix tokens, e.g. 15%.",
)
@click.option(
    "--recompute-token-rules",
    default="deviation",
    show_default=True,
    metavar="RULE[,RULE...]",
    help="Which tokens --recompute-tokens recomputes: deviation (CacheBlend: largest K/V deviation at "
    "an early layer), last (the prefix's tail), first, random; several give one point each.",
)
@click.option(
    "--recompute-sweep",
    type=click.Choice(("layers", "tokens", "both")),
    default=None,
    help="Write the quality/cost curve over the dial (table + recompute_curve.png with --report). "
    "With any --recompute-* option the run is the recompute curve (native, transferred, the "
    "points, no_prefix; see docs/recompute.md): --conditions, --gate and greedy are not used.",
)
@click.option(
    "--recompute-mode",
    type=click.Choice(("target", "source")),
    default="target",
    show_default=True,
    help="Input of recomputed layers: the target's own forward, or the source's hidden states.",
)
@click.option(
    "--recompute-select",
    type=click.Choice(("greedy", "profile", "prefix")),
    default="greedy",
    show_default=True,
    help="auto:X layer choice: greedy group search, single-layer profile ranking, "
    "or layers 0..K-1 (cheapest with --recompute-mode target).",
)
@click.option(
    "--recompute-group", default=1, show_default=True, type=count(1), help="Layers per group in the greedy search."
)
@click.option(
    "--calibration-samples",
    default=16,
    show_default=True,
    type=count(1),
    help="Corpus-front samples for the layer profiling pass.",
)
@click.option(
    "--frontier",
    default=None,
    metavar="R[,R...]",
    help="The compute frontier instead of the conditions: for each share R of the prefix, truncated@R "
    "(the target prefills only --sink first tokens and the last R, at their original positions) beside "
    "tail@R (the same rows computed by the target over the transferred cache), with native, source, "
    "transferred and no_prefix, FLOP shares, paired differences and a verdict (see docs/recompute.md).",
)
@click.option(
    "--sink", default=4, show_default=True, type=count(0), help="Sink tokens (the prefix's first) kept by --frontier."
)
def eval_cmd(
    source,
    target,
    mapping_ref,
    corpus,
    samples,
    prefix_len,
    continuation_len,
    greedy_tokens,
    heldout_fraction,
    conditions,
    bootstrap,
    seed,
    batch_size,
    top_k,
    top_p,
    no_attention,
    dtype,
    as_json,
    report_dir,
    gates,
    accept_mismatch,
    threads,
    allow_overlap=False,
    partial_path=None,
    recompute_layers=None,
    recompute_tokens=None,
    recompute_token_rules="deviation",
    recompute_sweep=None,
    recompute_mode="target",
    recompute_select="greedy",
    recompute_group=1,
    calibration_samples=16,
    frontier=None,
    sink=4,
):
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
    from click.core import ParameterSource

    from kvbridge.evaluate.settings import EvalSettings, RecomputeSettings

    given = click.get_current_context().get_parameter_source("heldout_fraction") != ParameterSource.DEFAULT
    settings = EvalSettings(  # every check of the options runs here, before anything is loaded
        mapping=mapping_ref,
        corpus=corpus,
        samples=samples,
        prefix_len=prefix_len,
        continuation_len=continuation_len,
        greedy_tokens=greedy_tokens,
        heldout_fraction=heldout_fraction if given else None,
        conditions=conditions,
        bootstrap=bootstrap,
        seed=seed,
        batch_size=batch_size,
        top_k=top_k,
        top_p=top_p,
        attention=not no_attention,
        gates=gates,
        report_dir=report_dir,
        accept_fingerprint_mismatch=accept_mismatch,
        allow_overlap=allow_overlap,
        partial_path=partial_path,
        recompute=RecomputeSettings(
            layers=recompute_layers,
            tokens=recompute_tokens,
            token_rules=recompute_token_rules,
            sweep=recompute_sweep,
            mode=recompute_mode,
            select=recompute_select,
            group=recompute_group,
            calibration_samples=calibration_samples,
        ),
        frontier=frontier,
        sink=sink,
    )
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if threads:
        torch.set_num_threads(int(threads))
    from kvbridge.cli.options import load_pair
    from kvbridge.evaluate.report import terminal_table, to_json
    from kvbridge.evaluate.run import evaluate_run
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
        Run.of(pair, settings), progress=progress, heartbeat=hb, warn=lambda text: click.echo(f"warning: {text}", err=True)
    )
    if bar is not None:
        bar.close()
    if run.written and not as_json:
        click.echo(f"report: {', '.join(str(p) for p in run.written.values())}", err=True)
    if run.frontier:
        from kvbridge.recompute.frontier_report import table as frontier_table

        click.echo(to_json(run.result) if as_json else frontier_table(run.result))
        return
    if run.recompute:
        from kvbridge.recompute.report import table as recompute_table

        click.echo(to_json(run.result) if as_json else recompute_table(run.result))
        return
    click.echo(to_json(run.result) if as_json else terminal_table(run.result))
    if run.exit_code:
        click.echo(f"gates FAILED: {', '.join(run.failed_gates)}", err=True)
        sys.stdout.flush()
        click.get_current_context().exit(run.exit_code)


eval_cmd.help = eval_cmd.help.replace(
    "METRICS", "Metrics:\n" + "\n".join("    " + line for line in metric_help().splitlines()), 1
)
