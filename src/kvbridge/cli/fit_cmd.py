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
            from kvbridge.fit.pipeline import parse_top_k

            try:
                out = parse_top_k(text)
            except ConfigError as exc:
                self.fail(exc.what, param, ctx)
            return [v if v == "all" else super(TopK, self).convert(v, param, ctx) for v in out] \
                if isinstance(out, list) else out
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
            self.bar = click.progressbar(length=max(1, n), label=f"{tag:<8}", show_eta=True, show_percent=True,
                                         file=sys.stderr, item_show_func=self._rate, width=30)
            self.bar.__enter__()
        elif kind == "advance" and self.bar is not None:
            self.done += n
            self.bar.update(n, self.done)
        elif kind == "end" and self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
            secs = time.perf_counter() - self.t0
            click.echo(f"{tag}: {self.done:,} tokens through both models in {secs:.1f} s "
                       f"({self._rate(None)}){self.note}", err=True)

    def _rate(self, _item) -> str:
        secs = max(time.perf_counter() - self.t0, 1e-9)
        return f"{self.done / secs:,.0f} tok/s"


#: shortcut flags -> fitter option keys (passed only when given; a fitter without the key refuses it)
SHORTCUTS = {"top_k": "top_k", "alpha": "alpha", "memory_gib": "memory_budget", "estimator": "estimator",
             "estimator_options": "estimator_options", "max_samples": "max_samples"}


def option_values(pairs, **flags) -> dict:
    """The fitter options from ``-o key=value`` pairs and the shortcut flags that were given."""
    from kvbridge.errors import ConfigError
    from kvbridge.fit.protocol import parse_pairs

    values = parse_pairs(pairs)
    for flag, key in SHORTCUTS.items():
        value = flags.get(flag)
        if value is None:
            continue
        if key in values:
            raise ConfigError(f"option {key} is given twice (a flag and -o {key}=...)", "give it once")
        values[key] = int(value * 2**30) if flag == "memory_gib" else value
    return values


@click.command("fit")
@click.argument("source")
@click.argument("target")
@click.option("--corpus", default=None, type=click.Path(exists=False), help="Text file, JSONL with a 'text' field, or folder of .py/.txt files (required unless --plan); a folder is split by file (--corpus-heldout) and only its calibration part is read.")
@click.option("--corpus-heldout", default=0.1, show_default=True, type=real(0, 1, min_open=True, max_open=True),
              help="Folder corpora: share of the files held out for eval, chosen by a hash of each file's relative path "
                   "(recorded in the mapping; `eval` then reads only those).")
@click.option("--out", default=None, type=click.Path(), help="Mapping folder to write (mapping.safetensors + manifest.json; required unless --plan).")
@click.option("--fitter", default="ridge", show_default=True, help="Fitter plugin (ridge, ridge-headwise, sklearn, ...).")
@click.option("-o", "--option", "fitter_opts", multiple=True, metavar="KEY=VALUE",
              help="A fitter option (repeatable), checked against the fitter's options dataclass: unknown keys are "
                   "refused, values coerced to their types, e.g. -o top_k=2 -o alpha=auto (docs/plugins.md lists "
                   "each fitter's options).")
@click.option("--top-k", default=None, type=TopK(), help="Source layers per target layer (ridge, sklearn; default 4, "
              "or the source's layers when it has fewer) = -o top_k=N. A list (--top-k 1,2,4,8,all; ridge) fits every "
              "k from one pass of forwards and writes one mapping per k into --out/k1, --out/k2, ... --out/kall.")
@click.option("--seq-len", type=count(2), default=512, show_default=True, help="Tokens per calibration sequence.")
@click.option("--tokens", default=None, type=count(1), help="Calibration tokens to read (default: the whole corpus).")
@click.option("--stride", type=count(1), default=4, show_default=True, help="Keep every stride-th position of each sequence.")
@click.option("--skip", type=count(0), default=0, show_default=True, help="Drop the first N positions of each sequence (attention sinks).")
@click.option("--alpha", default=None, help="Ridge strength, or 'auto' (chosen on the held-out split); default 0.01 = -o alpha=X.")
@click.option("--heldout", type=real(), default=0.1, show_default=True, help="Share of sequences held out for R² (and --alpha auto).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the position sampling and the held-out split.")
@click.option("--batch-size", type=Number(int), default=4, show_default=True, help="Sequences per forward pass.")
@click.option("--estimator", default=None, help="sklearn fitter: 'module:Class' (e.g. sklearn.linear_model:RidgeCV) = -o estimator=X.")
@click.option("--estimator-options", default=None, help="sklearn fitter: JSON options of the estimator.")
@click.option("--max-samples", default=None, type=count(1), help="sklearn fitter: cap on materialised observations (default 100000).")
@click.option("--memory", "memory_gib", default=None, type=real(0, min_open=True), help="Statistics memory budget in GiB (default 8 or $KVBRIDGE_FIT_MEMORY).")
@click.option("--dtype", default="float32", type=click.Choice(DTYPES), show_default=True, help="Dtype to load the models in.")
@click.option("--keep-stats", "keep_stats", default=None, type=click.Path(), help="Also write the fit's statistics "
              "(safetensors + manifest.json with both models' fingerprints) to this folder, for --from-stats (ridge).")
@click.option("--from-stats", "from_stats", default=None, type=click.Path(), help="Solve from statistics kept by "
              "--keep-stats instead of running the models (no weights loaded): other --top-k (up to the kept one), "
              "--alpha; SOURCE and TARGET are checked against the kept specs.")
@click.option("--resume", is_flag=True, help="Keep resumable statistics in .<out>.fitstate/ beside --out (checksummed; removed on success) "
                                          "and continue an interrupted fit from them.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out folder.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--plan", "plan_only", is_flag=True, help="Print the resource plan (statistics memory, blocking, artifact "
              "size, FLOPs, time at --device-flops) from the configs alone and exit: no weights loaded.")
@click.option("--device-flops", default=None, type=real(0, min_open=True), help="--plan: the device's FLOP/s for the time estimate, e.g. 1e14.")
@click.option("--calibrate", "plan_device", default=None, metavar="DEVICE", help="--plan: measure the rates of each part "
              "of a fit here (one random-weight decoder layer per model, float64 GEMM and solve, memory, sha256; a few "
              "seconds, imports torch) on DEVICE (cpu, cuda) and estimate the time from them.")
def fit(source, target, corpus, corpus_heldout, out, fitter, fitter_opts, top_k, seq_len, tokens, stride, skip, alpha,
        heldout, seed, batch_size, estimator, estimator_options, max_samples, memory_gib, dtype, keep_stats,
        from_stats, resume, overwrite, quiet, plan_only, device_flops, plan_device):
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

    plan_k = _plan_top_k(top_k, source) if plan_only else None
    if plan_only:  # torch-free: configs / manifests only
        from kvbridge.fit.plan import plan

        rates = None
        if plan_device:
            from kvbridge.fit.plan_rates import measure_rates

            rates = measure_rates(source, target, seq_len=seq_len, batch_size=batch_size, stride=stride,
                                  top_k=plan_k, dtype=dtype, device=plan_device)
        p = plan(source, target, fitter=fitter, top_k=plan_k, tokens=tokens, seq_len=seq_len, stride=stride,
                 skip=skip, heldout=heldout, batch_size=batch_size, dtype=dtype,
                 memory_budget=None if memory_gib is None else int(memory_gib * 2**30), device_flops=device_flops,
                 rates=rates)
        click.echo("\n".join(p.lines()))
        return
    if from_stats is not None:
        _fit_from_stats(source, target, from_stats, out, top_k=top_k, alpha=alpha, overwrite=overwrite,
                        corpus=corpus, keep_stats=keep_stats)
        return
    if corpus is None or out is None:
        raise ConfigError("kvbridge fit needs --corpus and --out", "give both, or --plan for the resource plan only")
    from kvbridge.fit.calibrate import CalibrationConfig, check_same_tokens

    from kvbridge.artifacts import check_replaceable
    from kvbridge.check import validate
    from kvbridge.fit.artifact import KIND

    from kvbridge.fit.pipeline import SWEEP_KIND

    sweep = isinstance(top_k, list) and len(top_k) > 1
    check_replaceable(out, SWEEP_KIND if sweep else KIND, overwrite=overwrite)  # only ever replaces its own kind
    if keep_stats is not None:
        from kvbridge.fit.keep import KIND as STATS_KIND

        check_replaceable(keep_stats, STATS_KIND, overwrite=overwrite)
    if alpha is not None:
        validate.alpha(alpha)
    validate.memory_gib(memory_gib)
    validate.seq_len(seq_len)
    validate.tokens(tokens)
    validate.stride(stride, seq_len, skip=validate.non_negative_int(skip, "--skip"))
    if isinstance(top_k, list) and len(top_k) == 1:  # "all"
        top_k = top_k[0]
    single_k = None if isinstance(top_k, list) or top_k == "all" else top_k  # a sweep goes to fit() below
    values = option_values(fitter_opts, top_k=single_k, alpha=alpha, memory_gib=memory_gib, estimator=estimator,
                           estimator_options=estimator_options, max_samples=max_samples)
    calibration = CalibrationConfig(stride=stride, skip=skip, heldout=heldout, seed=seed, batch_size=batch_size,
                                    seq_len=seq_len, tokens=tokens)
    from kvbridge.fit.pipeline import Provenance, fitter_options, load_fitter
    from kvbridge.plugins import get_host

    options = fitter_options(load_fitter(get_host(), fitter), values)  # refuse bad options before loading models
    import os

    from kvbridge.evaluate.corpus import calibration_texts
    from kvbridge.progress import Heartbeat

    hb = click.get_current_context().with_resource(  # stopped when the command ends, however it ends
        Heartbeat("fit", enabled=not quiet and os.environ.get("RANK", "0") == "0"))
    hb.stage("reading the corpus")
    texts, sha, split = calibration_texts(corpus, corpus_heldout)
    t0 = time.perf_counter()
    from kvbridge.cli.options import load_pair, revision_of
    from kvbridge.models import resolve as _resolve

    src, tgt = _resolve(source), _resolve(target)
    sweep_arg = None
    if isinstance(top_k, list) or top_k == "all":
        sweep_arg = top_k if isinstance(top_k, list) else "all"
    elif top_k is None and "top_k" not in values and hasattr(options, "top_k"):
        layers = src.spec().num_layers
        if options.top_k > layers:  # the default, larger than the source allows: clamp and say so
            click.echo(f"note: --top-k defaults to {options.top_k}, but {source} has {layers} layers: using "
                       f"--top-k {layers} (all of them)", err=True)
            import dataclasses

            options = dataclasses.replace(options, top_k=layers)
    hb.stage("loading the models")
    pair = load_pair(src, tgt, dtype=dtype)  # the shared tokenizer is checked before any weights load
    loaded_src, loaded_tgt, tok_fp = pair.source, pair.target, pair.tokenizer
    smodel, stok, tmodel, ttok = loaded_src.model, loaded_src.tokenizer, loaded_tgt.model, loaded_tgt.tokenizer
    check_same_tokens(texts, stok, ttok)

    from kvbridge.fit import distributed as dist_mod
    from kvbridge.fit.pipeline import fit as run_fit

    ctx = dist_mod.setup()
    main = ctx is None or ctx.is_main
    mapping = run_fit(smodel, tmodel, texts, fitter=fitter, options=options, calibration=calibration, tokenizer=stok,
                      tokenizer_fingerprint=tok_fp, corpus_sha256=sha, corpus_path=corpus, corpus_split=split, out=out, overwrite=overwrite, resume=resume,
                      provenance=Provenance(src.name, tgt.name, revision_of(src), revision_of(tgt)),
                      progress=Progress(main and not quiet, ctx.world if ctx else 1, hb), distributed=ctx,
                      keep_stats=keep_stats, **({"top_k": sweep_arg} if sweep_arg is not None else {}))
    if not main:
        return
    if keep_stats is not None:
        click.echo(f"kept the statistics in {keep_stats} (kvbridge fit SOURCE TARGET --from-stats {keep_stats} --out ...)")
    if isinstance(mapping, dict):
        _report_sweep(mapping, out, time.perf_counter() - t0)
        return
    _report(mapping, out, time.perf_counter() - t0, stride, skip)


def _plan_top_k(top_k, source) -> int:
    """The top-k the plan is made for: the largest of a list; ``all`` and a default over the source's
    layers become the source's layer count (the plan of a k sweep is the plan of its largest k)."""
    if top_k is None:
        return 4
    values = top_k if isinstance(top_k, list) else [top_k]
    if "all" in values:
        from kvbridge.models import resolve

        return resolve(source).spec().num_layers
    return max(int(v) for v in values)


def _fit_from_stats(source, target, folder, out, *, top_k, alpha, overwrite, corpus, keep_stats) -> None:
    from kvbridge.errors import ConfigError

    if out is None:
        raise ConfigError("kvbridge fit --from-stats needs --out", "give the mapping folder to write")
    if corpus is not None or keep_stats is not None:
        raise ConfigError(f"--from-stats solves from kept statistics: --{'corpus' if corpus is not None else 'keep-stats'}"
                          " does not apply", "drop it, or fit from the models without --from-stats")
    from kvbridge.artifacts import check_replaceable
    from kvbridge.fit.artifact import KIND, model_identity
    from kvbridge.fit.pipeline import SWEEP_KIND, fit_from_stats
    from kvbridge.models import resolve

    if alpha is not None:
        from kvbridge.check import validate

        validate.alpha(alpha)
    check_replaceable(out, SWEEP_KIND if isinstance(top_k, list) and len(top_k) > 1 else KIND, overwrite=overwrite)
    t0 = time.perf_counter()
    idents = [model_identity(resolve(ref).config) for ref in (source, target)]  # configs only: no weights
    if isinstance(top_k, list) and len(top_k) == 1:
        top_k = top_k[0]
    result = fit_from_stats(folder, out=out, top_k=top_k if not isinstance(top_k, list) else ",".join(map(str, top_k)),
                            alpha=alpha, source=idents[0], target=idents[1], overwrite=overwrite)
    if isinstance(result, dict):
        _report_sweep(result, out, time.perf_counter() - t0)
    else:
        _report(result, out, time.perf_counter() - t0, None, None)


def _report_sweep(mappings: dict, out, secs: float) -> None:
    from kvbridge.fit.pipeline import sweep_folder

    click.echo(f"wrote {out}  ({len(mappings)} mappings from one pass, {secs:.1f} s)")
    for label, m in mappings.items():
        summ = m.report.r2_summary or {}
        r2 = (f"held-out R² mean {summ['mean']:.4f} (K {summ['mean_k']:.4f}, V {summ['mean_v']:.4f})"
              if summ.get("heldout") else "no held-out R²")
        click.echo(f"  {sweep_folder(label)}: top-k {m.report.params.get('top_k')}, {r2}")
        for w in m.report.warnings:
            click.echo(f"warning: {sweep_folder(label)}: {w}", err=True)


def _report(mapping, out, secs: float, stride, skip) -> None:
    rep = mapping.report
    cal = mapping.manifest.get("calibration", {})
    summ = rep.r2_summary or {}
    click.echo(f"wrote {out}  ({mapping.fitter}, {mapping.mode}, {secs:.1f} s)")
    click.echo(f"  calibration: {cal.get('tokens')} tokens in {cal.get('sequences')} sequences, "
               f"{cal.get('observations_train')} train / {cal.get('observations_heldout')} held-out observations "
               f"per head (stride {cal.get('stride', stride)}, skip {cal.get('skip', skip)})")
    corp, span = cal.get("corpus") or {}, cal.get("span") or {}
    if corp:
        click.echo(f"  corpus: sha256 {corp['sha256']} ({corp['sha256_of']}); calibration read bytes "
                   f"{span.get('bytes', ['?', '?'])[0]}-{span.get('bytes', ['?', '?'])[1]} ({span.get('tokens')} tokens); "
                   f"{cal.get('observations_per_feature', '?')} observations per feature "
                   f"(warning below {cal.get('min_observations_per_feature', '?')})")
    sel = mapping.layer_selection()
    shown = "; ".join(f"{t}<-{s}" for t, s in enumerate(sel[:8])) + ("; ..." if len(sel) > 8 else "")
    click.echo(f"  layer selection (target<-source): {shown}")
    if summ.get("heldout"):
        click.echo(f"  held-out R²: mean {summ['mean']:.4f} (K {summ['mean_k']:.4f}, V {summ['mean_v']:.4f}), "
                   f"min {summ['min']:.4f}")
    for w in rep.warnings:
        click.echo(f"warning: {w}", err=True)
