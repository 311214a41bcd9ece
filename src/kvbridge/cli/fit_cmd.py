"""``kvbridge fit``: fit a source -> target K/V mapping on a calibration corpus."""

from __future__ import annotations

import time

import click

from kvbridge.cli.options import load_pair, settings_from, settings_options
from kvbridge.fit.settings import FitSettings


@click.command("fit")
@click.argument("source")
@click.argument("target")
@settings_options(FitSettings)
def fit(source, target, **options):
    """Fit a mapping from SOURCE's KV cache to TARGET's on a calibration corpus.

    SOURCE and TARGET are model references (folders, .gguf files, zoo:NAME, smollm2, hub ids
    in the local Hugging Face cache; see `kvbridge describe --help`) with identical tokenizers. Both read the same token ids; per layer their RoPE-stripped
    keys and values are sampled every --stride positions and accumulated into float64
    statistics; the fitter selects source layers and solves per target (layer, KV head), K
    and V apart. The folder --out gets mapping.safetensors and manifest.json (held-out R²
    per target head, fingerprints of both models, calibration details), written atomically.

    Distributed: `torchrun --nproc-per-node N -m kvbridge fit ...` shards the corpus over
    ranks and all-reduces the statistics; rank 0 writes. With --resume, checkpoints are kept in
    .<out>.fitstate next to --out and a rerun with --resume continues from them; without it
    nothing but --out is ever written.
    """

    from kvbridge.errors import ConfigError

    settings = settings_from(FitSettings, options)  # every check of the options runs here
    if settings.plan:  # torch-free: configs / manifests only
        from kvbridge.fit.run import plan_fit

        click.echo("\n".join(plan_fit(source, target, settings).lines()))
        return
    t0 = time.perf_counter()
    if settings.from_stats is not None:
        from kvbridge.fit.run import refit

        _print(refit(source, target, settings), settings, time.perf_counter() - t0)
        return
    if settings.corpus is None or settings.out is None:
        raise ConfigError("kvbridge fit needs --corpus and --out", "give both, or --plan for the resource plan only")
    import os

    from kvbridge.fit.run import fit_run, prepare
    from kvbridge.progress import Heartbeat, pass_progress
    from kvbridge.run import Run

    hb = click.get_current_context().with_resource(  # stopped when the command ends, however it ends
        Heartbeat("fit", enabled=not settings.quiet and os.environ.get("RANK", "0") == "0")
    )
    hb.stage("reading the corpus")
    prepared = prepare(settings)  # every refusal that needs no model (options, out, corpus), before loading one
    t0 = time.perf_counter()

    hb.stage("loading the models")
    pair = load_pair(source, target, dtype=settings.dtype)  # the shared tokenizer is checked before any weights load
    from kvbridge.fit import distributed as dist_mod

    ctx = dist_mod.setup()
    main = ctx is None or ctx.is_main
    result = fit_run(
        Run.of(pair, settings),
        prepared=prepared,
        progress=pass_progress(main and not settings.quiet, ctx.world if ctx else 1, hb),
        warn=lambda note: click.echo(f"note: {note}", err=True),
        distributed=ctx,
    )
    if not main:
        return
    if settings.keep_stats is not None:
        click.echo(
            f"kept the statistics in {settings.keep_stats} (kvbridge fit SOURCE TARGET --from-stats "
            f"{settings.keep_stats} --out ...)"
        )
    _print(result, settings, time.perf_counter() - t0)


def _print(result, settings, secs: float) -> None:
    """A fit's mapping (or a sweep's ``{label: mapping}``) as the command prints it."""
    if isinstance(result, dict):
        return _report_sweep(result, settings.out, secs)
    refit = settings.from_stats is not None  # the statistics' own stride and skip are in the manifest
    stride, skip = (None, None) if refit else (settings.stride, settings.skip)
    rep, cal = result.report, result.manifest.get("calibration", {})
    summ = rep.r2_summary or {}
    click.echo(f"wrote {settings.out}  ({result.fitter}, {result.mode}, {secs:.1f} s)")
    click.echo(
        f"  calibration: {cal.get('tokens')} tokens in {cal.get('sequences')} sequences, "
        f"{cal.get('observations_train')} train / {cal.get('observations_heldout')} held-out observations "
        f"per head (stride {cal.get('stride', stride)}, skip {cal.get('skip', skip)})"
    )
    corp, span = cal.get("corpus") or {}, cal.get("span") or {}
    if corp:
        click.echo(
            f"  corpus: sha256 {corp['sha256']} ({corp['sha256_of']}); calibration read bytes "
            f"{span.get('bytes', ['?', '?'])[0]}-{span.get('bytes', ['?', '?'])[1]} ({span.get('tokens')} tokens); "
            f"{cal.get('observations_per_feature', '?')} observations per feature "
            f"(warning below {cal.get('min_observations_per_feature', '?')})"
        )
        tail = corp.get("heldout_tail") or {}
        if tail.get("heldout"):
            click.echo(
                f"  held out for eval (not read): the last {tail['heldout']:g} of the file, characters "
                f"{tail['chars'][0]}-{tail['chars'][1]} (`kvbridge eval --corpus` reads them)"
            )
    sel = result.layer_selection()
    shown = "; ".join(f"{t}<-{s}" for t, s in enumerate(sel[:8])) + ("; ..." if len(sel) > 8 else "")
    click.echo(f"  layer selection (target<-source): {shown}")
    if summ.get("heldout"):
        click.echo(
            f"  held-out R²: mean {summ['mean']:.4f} (K {summ['mean_k']:.4f}, V {summ['mean_v']:.4f}), "
            f"min {summ['min']:.4f}"
        )
    for w in rep.warnings:
        click.echo(f"warning: {w}", err=True)


def _report_sweep(mappings: dict, out, secs: float) -> None:
    from kvbridge.fit.pipeline import sweep_folder

    click.echo(f"wrote {out}  ({len(mappings)} mappings from one pass, {secs:.1f} s)")
    for label, m in mappings.items():
        summ = m.report.r2_summary or {}
        r2 = (
            f"held-out R² mean {summ['mean']:.4f} (K {summ['mean_k']:.4f}, V {summ['mean_v']:.4f})"
            if summ.get("heldout")
            else "no held-out R²"
        )
        click.echo(f"  {sweep_folder(label)}: top-k {m.report.params.get('top_k')}, {r2}")
        for w in m.report.warnings:
            click.echo(f"warning: {sweep_folder(label)}: {w}", err=True)
