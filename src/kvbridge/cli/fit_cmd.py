"""``kvbridge fit``: fit a source -> target K/V mapping on a calibration corpus."""

from __future__ import annotations

import sys
import time

import click

from kvbridge.cli.numbers import Number, SEED, count, real

from kvbridge.dtypes import LOAD_DTYPES as DTYPES  # noqa: E402


class TopK(Number):
    """``--top-k``: a whole number >= 1, ``all``, or a comma list of them (a k sweep from one pass)."""

    def __init__(self):
        super().__init__(int, 1)

    def convert(self, value, param, ctx):
        text = value if isinstance(value, str) else None
        if text is not None and ("," in text or text.strip().lower() == "all"):
            from kvbridge.errors import ConfigError
            from kvbridge.fit.settings import parse_top_k

            try:
                out = parse_top_k(text)
            except ConfigError as exc:
                self.fail(exc.what, param, ctx)
            return (
                [v if v == "all" else super(TopK, self).convert(v, param, ctx) for v in out]
                if isinstance(out, list)
                else out
            )
        return super().convert(value, param, ctx)

    def get_metavar(self, param, ctx=None):  # noqa: D102
        return "N[,N...|all]"


class Progress:
    """A click progress bar per pass, with tokens/s and an ETA (stderr, rank 0 only)."""

    def __init__(self, enabled: bool = True, world: int = 1, heartbeat=None):
        self.enabled = enabled
        self.heartbeat = heartbeat  # plain lines for logs (kvbridge.progress.Heartbeat; silent on a terminal)
        self.note = f" (rank 0 of {world}; each rank reads 1/{world} of the corpus)" if world > 1 else ""
        self.bar = None
        self.t0 = 0.0
        self.done = 0

    def __call__(self, event) -> None:
        kind, tag, n = event
        if not self.enabled:
            return
        hb = self.heartbeat
        if hb is not None:
            if kind == "start":
                hb.stage(f"{tag} forwards", max(1, n), "tokens")
            elif kind == "advance":
                hb.advance(n)
            elif kind == "end":
                hb.stage("solving and writing the mapping")
        if kind == "start":
            self.t0, self.done = time.perf_counter(), 0
            self.bar = click.progressbar(
                length=max(1, n),
                label=f"{tag:<8}",
                show_eta=True,
                show_percent=True,
                file=sys.stderr,
                item_show_func=self._rate,
                width=30,
            )
            self.bar.__enter__()
        elif kind == "advance" and self.bar is not None:
            self.done += n
            self.bar.update(n, self.done)
        elif kind == "end" and self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
            secs = time.perf_counter() - self.t0
            click.echo(
                f"{tag}: {self.done:,} tokens through both models in {secs:.1f} s ({self._rate(None)}){self.note}",
                err=True,
            )

    def _rate(self, _item) -> str:
        secs = max(time.perf_counter() - self.t0, 1e-9)
        return f"{self.done / secs:,.0f} tok/s"


@click.command("fit")
@click.argument("source")
@click.argument("target")
@click.option(
    "--corpus",
    default=None,
    type=click.Path(exists=False),
    help="Text file, JSONL with a 'text' field, or folder of .py/.txt files (required unless --plan); a folder is split by file, a file by position (--corpus-heldout), and only the calibration part is read.",
)
@click.option(
    "--corpus-heldout",
    default=0.1,
    show_default=True,
    type=real(0, 1, max_open=True),
    help="Share of the corpus held out for eval and not read by the fit (recorded in the mapping; `eval` "
    "then reads only it): a folder's files chosen by a hash of each file's relative path, or a file's "
    "last share of characters (from a line start: the tail `eval --heldout-fraction` reads). 0: none.",
)
@click.option(
    "--out",
    default=None,
    type=click.Path(),
    help="Mapping folder to write (mapping.safetensors + manifest.json; required unless --plan).",
)
@click.option(
    "--fitter", default="ridge", show_default=True, help="Fitter plugin (ridge, ridge-headwise, sklearn, ...)."
)
@click.option(
    "-o",
    "--option",
    "fitter_opts",
    multiple=True,
    metavar="KEY=VALUE",
    help="A fitter option (repeatable), checked against the fitter's options dataclass: unknown keys are "
    "refused, values coerced to their types, e.g. -o top_k=2 -o alpha=auto (docs/plugins.md lists "
    "each fitter's options).",
)
@click.option(
    "--top-k",
    default=None,
    type=TopK(),
    help="Source layers per target layer (ridge, sklearn; default 4, "
    "or the source's layers when it has fewer) = -o top_k=N. A list (--top-k 1,2,4,8,all; ridge) fits every "
    "k from one pass of forwards and writes one mapping per k into --out/k1, --out/k2, ... --out/kall.",
)
@click.option("--seq-len", type=count(2), default=512, show_default=True, help="Tokens per calibration sequence.")
@click.option("--tokens", default=None, type=count(1), help="Calibration tokens to read (default: the whole corpus).")
@click.option(
    "--tokens-offset",
    "tokens_offset",
    default=0,
    type=count(0),
    show_default=True,
    help="Skip this many calibration tokens first: runs with offsets 0, T, 2T, ... and --tokens T read disjoint "
    "chunks; --from-stats A,B,... merges their kept statistics.",
)
@click.option(
    "--stride", type=count(1), default=4, show_default=True, help="Keep every stride-th position of each sequence."
)
@click.option(
    "--skip",
    type=count(0),
    default=0,
    show_default=True,
    help="Drop the first N positions of each sequence (attention sinks).",
)
@click.option(
    "--alpha", default=None, help="Ridge strength, or 'auto' (chosen on the held-out split); default 0.01 = -o alpha=X."
)
@click.option(
    "--heldout",
    type=real(),
    default=0.1,
    show_default=True,
    help="Share of sequences held out for R² (and --alpha auto).",
)
@click.option(
    "--seed", type=SEED, default=0, show_default=True, help="Seed of the position sampling and the held-out split."
)
@click.option("--batch-size", type=Number(int), default=4, show_default=True, help="Sequences per forward pass.")
@click.option(
    "--estimator",
    default=None,
    help="sklearn fitter: 'module:Class' (e.g. sklearn.linear_model:RidgeCV) = -o estimator=X.",
)
@click.option("--estimator-options", default=None, help="sklearn fitter: JSON options of the estimator.")
@click.option(
    "--max-samples",
    default=None,
    type=count(1),
    help="sklearn fitter: cap on materialised observations (default 100000).",
)
@click.option(
    "--memory",
    "memory_gib",
    default=None,
    type=real(0, min_open=True),
    help="Statistics memory budget in GiB (default 8 or $KVBRIDGE_FIT_MEMORY).",
)
@click.option(
    "--dtype", default="float32", type=click.Choice(DTYPES), show_default=True, help="Dtype to load the models in."
)
@click.option(
    "--keep-stats",
    "keep_stats",
    default=None,
    type=click.Path(),
    help="Also write the fit's statistics "
    "(safetensors + manifest.json with both models' fingerprints) to this folder, for --from-stats (ridge).",
)
@click.option(
    "--from-stats",
    "from_stats",
    default=None,
    type=click.Path(),
    help="Solve from statistics kept by "
    "--keep-stats instead of running the models (no weights loaded): other --top-k (up to the kept one), "
    "--alpha; SOURCE and TARGET are checked against the kept specs. Several folders (DIR1,DIR2,...: runs on "
    "disjoint chunks, --tokens-offset) are merged into one fit.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Keep resumable statistics in .<out>.fitstate/ beside --out (checksummed; removed on success) "
    "and continue an interrupted fit from them.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing --out folder.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option(
    "--plan",
    "plan_only",
    is_flag=True,
    help="Print the resource plan (statistics memory, blocking, artifact "
    "size, FLOPs, time at --device-flops) from the configs alone and exit: no weights loaded.",
)
@click.option(
    "--device-flops",
    default=None,
    type=real(0, min_open=True),
    help="--plan: the device's FLOP/s for the time estimate, e.g. 1e14.",
)
@click.option(
    "--calibrate",
    "plan_device",
    default=None,
    metavar="DEVICE",
    help="--plan: measure the rates of each part "
    "of a fit here (one random-weight decoder layer per model, float64 GEMM and solve, memory, sha256; a few "
    "seconds, imports torch) on DEVICE (cpu, cuda) and estimate the time from them.",
)
def fit(
    source,
    target,
    corpus,
    corpus_heldout,
    out,
    fitter,
    fitter_opts,
    top_k,
    seq_len,
    tokens,
    tokens_offset,
    stride,
    skip,
    alpha,
    heldout,
    seed,
    batch_size,
    estimator,
    estimator_options,
    max_samples,
    memory_gib,
    dtype,
    keep_stats,
    from_stats,
    resume,
    overwrite,
    quiet,
    plan_only,
    device_flops,
    plan_device,
):
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
    from kvbridge.fit.settings import FitSettings

    settings = FitSettings(
        corpus=corpus,
        corpus_heldout=corpus_heldout,
        out=out,
        fitter=fitter,
        fitter_options=fitter_opts,
        top_k=top_k,
        seq_len=seq_len,
        tokens=tokens,
        tokens_offset=tokens_offset,
        stride=stride,
        skip=skip,
        alpha=alpha,
        heldout=heldout,
        seed=seed,
        batch_size=batch_size,
        estimator=estimator,
        estimator_options=estimator_options,
        max_samples=max_samples,
        memory_gib=memory_gib,
        dtype=dtype,
        keep_stats=keep_stats,
        from_stats=from_stats,
        resume=resume,
        overwrite=overwrite,
        quiet=quiet,
        plan=plan_only,
        device_flops=device_flops,
        plan_device=plan_device,
    )
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
    from kvbridge.progress import Heartbeat
    from kvbridge.run import Run

    hb = click.get_current_context().with_resource(  # stopped when the command ends, however it ends
        Heartbeat("fit", enabled=not settings.quiet and os.environ.get("RANK", "0") == "0")
    )
    hb.stage("reading the corpus")
    prepared = prepare(settings)  # every refusal that needs no model (options, out, corpus), before loading one
    t0 = time.perf_counter()
    from kvbridge.cli.options import load_pair

    hb.stage("loading the models")
    pair = load_pair(source, target, dtype=settings.dtype)  # the shared tokenizer is checked before any weights load
    from kvbridge.fit import distributed as dist_mod

    ctx = dist_mod.setup()
    main = ctx is None or ctx.is_main
    result = fit_run(
        Run.of(pair, settings),
        prepared=prepared,
        progress=Progress(main and not settings.quiet, ctx.world if ctx else 1, hb),
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
        _report_sweep(result, settings.out, secs)
    elif settings.from_stats is not None:
        _report(result, settings.out, secs, None, None)
    else:
        _report(result, settings.out, secs, settings.stride, settings.skip)


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


def _report(mapping, out, secs: float, stride, skip) -> None:
    rep = mapping.report
    cal = mapping.manifest.get("calibration", {})
    summ = rep.r2_summary or {}
    click.echo(f"wrote {out}  ({mapping.fitter}, {mapping.mode}, {secs:.1f} s)")
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
    sel = mapping.layer_selection()
    shown = "; ".join(f"{t}<-{s}" for t, s in enumerate(sel[:8])) + ("; ..." if len(sel) > 8 else "")
    click.echo(f"  layer selection (target<-source): {shown}")
    if summ.get("heldout"):
        click.echo(
            f"  held-out R²: mean {summ['mean']:.4f} (K {summ['mean_k']:.4f}, V {summ['mean_v']:.4f}), "
            f"min {summ['min']:.4f}"
        )
    for w in rep.warnings:
        click.echo(f"warning: {w}", err=True)
