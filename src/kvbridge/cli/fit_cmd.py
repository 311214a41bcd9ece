"""``kvbridge fit``: fit a source -> target K/V mapping on a calibration corpus."""

from __future__ import annotations

import sys
import time

import click

from kvbridge.cli.numbers import Number, SEED, count, real

DTYPES = ("float32", "bfloat16", "float16", "auto")


class Progress:
    """A click progress bar per pass, with tokens/s and an ETA (stderr, rank 0 only)."""

    def __init__(self, enabled: bool = True, world: int = 1):
        self.enabled = enabled
        self.note = f" (rank 0 of {world}; each rank reads 1/{world} of the corpus)" if world > 1 else ""
        self.bar = None
        self.t0 = 0.0
        self.done = 0

    def __call__(self, event) -> None:
        kind, tag, n = event
        if not self.enabled:
            return
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


def _deprecated_flag(old: str, new: str):
    """A hidden flag kept for old scripts: it warns once and sets ``new``."""

    def callback(ctx, _param, value):
        if value:
            click.echo(f"warning: {old} is deprecated; use {new}", err=True)
        return value

    return callback


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
@click.option("--corpus", default=None, type=click.Path(exists=False), help="Text file, JSONL with a 'text' field, or folder of .txt files (required unless --plan).")
@click.option("--out", default=None, type=click.Path(), help="Mapping folder to write (mapping.safetensors + manifest.json; required unless --plan).")
@click.option("--fitter", default="ridge", show_default=True, help="Fitter plugin (ridge, ridge-headwise, sklearn, ...).")
@click.option("-o", "--option", "fitter_opts", multiple=True, metavar="KEY=VALUE",
              help="A fitter option (repeatable), checked against the fitter's options dataclass: unknown keys are "
                   "refused, values coerced to their types, e.g. -o top_k=2 -o alpha=auto (docs/plugins.md lists "
                   "each fitter's options).")
@click.option("--top-k", default=None, type=count(1), help="Source layers per target layer (ridge, sklearn; default 4) = -o top_k=N.")
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
@click.option("--resume", is_flag=True, help="Keep resumable statistics in .<out>.fitstate/ beside --out (checksummed; removed on success) "
                                          "and continue an interrupted fit from them.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out folder.")
@click.option("--force", "force_alias", is_flag=True, hidden=True, callback=_deprecated_flag("--force", "--overwrite"),
              help="Deprecated alias of --overwrite.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--plan", "plan_only", is_flag=True, help="Print the resource plan (statistics memory, blocking, artifact "
              "size, FLOPs, time at --device-flops) from the configs alone and exit: no weights loaded.")
@click.option("--device-flops", default=None, type=real(0, min_open=True), help="--plan: the device's FLOP/s for the time estimate, e.g. 1e14.")
@click.option("--calibrate", "plan_device", default=None, metavar="DEVICE", help="--plan: measure the rates of each part "
              "of a fit here (one random-weight decoder layer per model, float64 GEMM and solve, memory, sha256; a few "
              "seconds, imports torch) on DEVICE (cpu, cuda) and estimate the time from them.")
def fit(source, target, corpus, out, fitter, fitter_opts, top_k, seq_len, tokens, stride, skip, alpha, heldout, seed,
        batch_size, estimator, estimator_options, max_samples, memory_gib, dtype, resume, overwrite, force_alias,
        quiet, plan_only, device_flops, plan_device):
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

    if plan_only:  # torch-free: configs / manifests only
        from kvbridge.fit.plan import plan

        rates = None
        if plan_device:
            from kvbridge.fit.plan_rates import measure_rates

            rates = measure_rates(source, target, seq_len=seq_len, batch_size=batch_size, stride=stride,
                                  top_k=top_k or 4, dtype=dtype, device=plan_device)
        p = plan(source, target, fitter=fitter, top_k=top_k or 4, tokens=tokens, seq_len=seq_len, stride=stride,
                 skip=skip, heldout=heldout, batch_size=batch_size, dtype=dtype,
                 memory_budget=None if memory_gib is None else int(memory_gib * 2**30), device_flops=device_flops,
                 rates=rates)
        click.echo("\n".join(p.lines()))
        return
    if corpus is None or out is None:
        raise ConfigError("kvbridge fit needs --corpus and --out", "give both, or --plan for the resource plan only")
    from kvbridge.fit.calibrate import CalibrationConfig, check_same_tokens, load_corpus

    overwrite = overwrite or force_alias
    from kvbridge.artifacts import check_replaceable
    from kvbridge.check import validate
    from kvbridge.fit.artifact import KIND

    check_replaceable(out, KIND, overwrite=overwrite)  # a mapping only ever replaces a mapping kvbridge wrote
    if alpha is not None:
        validate.alpha(alpha)
    validate.memory_gib(memory_gib)
    validate.seq_len(seq_len)
    validate.tokens(tokens)
    validate.stride(stride, seq_len, skip=validate.non_negative_int(skip, "--skip"))
    values = option_values(fitter_opts, top_k=top_k, alpha=alpha, memory_gib=memory_gib, estimator=estimator,
                           estimator_options=estimator_options, max_samples=max_samples)
    calibration = CalibrationConfig(stride=stride, skip=skip, heldout=heldout, seed=seed, batch_size=batch_size,
                                    seq_len=seq_len, tokens=tokens)
    from kvbridge.fit.pipeline import Provenance, fitter_options, load_fitter
    from kvbridge.plugins import get_host

    options = fitter_options(load_fitter(get_host(), fitter), values)  # refuse bad options before loading models
    texts, sha = load_corpus(corpus)
    t0 = time.perf_counter()
    from kvbridge.cli.options import load_pair, revision_of

    pair = load_pair(source, target, dtype=dtype)  # the shared tokenizer is checked before any weights load
    loaded_src, loaded_tgt, tok_fp = pair.source, pair.target, pair.tokenizer
    src, tgt = loaded_src.ref, loaded_tgt.ref
    smodel, stok, tmodel, ttok = loaded_src.model, loaded_src.tokenizer, loaded_tgt.model, loaded_tgt.tokenizer
    check_same_tokens(texts, stok, ttok)

    from kvbridge.fit import distributed as dist_mod
    from kvbridge.fit.pipeline import fit as run_fit

    ctx = dist_mod.setup()
    main = ctx is None or ctx.is_main
    mapping = run_fit(smodel, tmodel, texts, fitter=fitter, options=options, calibration=calibration, tokenizer=stok,
                      tokenizer_fingerprint=tok_fp, corpus_sha256=sha, corpus_path=corpus, out=out, overwrite=overwrite, resume=resume,
                      provenance=Provenance(src.name, tgt.name, revision_of(src), revision_of(tgt)),
                      progress=Progress(main and not quiet, ctx.world if ctx else 1), distributed=ctx)
    if not main:
        return
    rep = mapping.report
    cal = mapping.manifest.get("calibration", {})
    summ = rep.r2_summary or {}
    click.echo(f"wrote {out}  ({mapping.fitter}, {mapping.mode}, {time.perf_counter() - t0:.1f} s)")
    click.echo(f"  calibration: {cal.get('tokens')} tokens in {cal.get('sequences')} sequences, "
               f"{cal.get('observations_train')} train / {cal.get('observations_heldout')} held-out observations "
               f"per head (stride {stride}, skip {skip})")
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
