"""``kvbridge fit``: fit a source -> target K/V mapping on a calibration corpus."""

from __future__ import annotations

import sys
import time

import click

DTYPES = ("float32", "bfloat16", "float16", "auto")


def resolve_folder(ref: str, *, host=None):
    """The resolved local model folder (or offline HF-cache snapshot) of ``ref``."""
    from kvbridge.errors import ConfigError
    from kvbridge.check.sources import resolve

    resolved = resolve(ref, host=host)
    if not resolved.folder or resolved.kind not in ("dir", "hf-cache"):
        raise ConfigError(f"{ref}: a {resolved.kind} reference has no weights",
                          "pass a local model folder (save_pretrained output) or a model in the Hugging Face cache")
    return resolved


def load_model(ref, *, dtype: str = "float32", host=None):
    """``(resolved, model, tokenizer)`` of a local model folder or an offline HF-cache id."""
    from kvbridge.errors import ConfigError

    resolved = ref if hasattr(ref, "folder") else resolve_folder(ref, host=host)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress goes to stderr; keep it readable

    kwargs = {"local_files_only": True}
    if dtype != "auto":
        kwargs["dtype"] = getattr(torch, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved.folder, **kwargs).eval()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{resolved.folder}: cannot load the model ({' '.join(str(exc).split())[:200]})",
                          "pass a folder written by save_pretrained, with its weights") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved.folder, local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"{resolved.folder}: cannot load the tokenizer ({' '.join(str(exc).split())[:200]})",
                          "the model folder needs its tokenizer files") from None
    return resolved, model, tokenizer


def tokenizer_pair(src, tgt) -> dict:
    """The shared tokenizer's fingerprint, or a refusal with the reason ``kvbridge check`` gives."""
    from kvbridge.fit.calibrate import CalibrationError
    from kvbridge.check.tokenizer_fp import compare

    fps = []
    for role, res in (("source", src), ("target", tgt)):
        fp = res.tokenizer()
        if fp is None:
            raise CalibrationError(f"{role} {res.ref}: no tokenizer files found in {res.folder}",
                                   "paired calibration needs both tokenizers to check the token ids agree")
        fps.append(fp)
    verdict, action = compare(*fps)
    if verdict == "blocking":
        raise CalibrationError(f"the tokenizers of {src.ref} and {tgt.ref} differ: {action}",
                               "fit between models that share a tokenizer (see `kvbridge check`)")
    if verdict != "same":
        click.echo(f"warning: tokenizers: {action}", err=True)
    return fps[0].to_dict()


def _revision(resolved) -> str | None:
    """The commit of a Hugging Face cache snapshot (its folder name), else None."""
    from pathlib import Path

    return Path(resolved.folder).name if resolved.kind == "hf-cache" and resolved.folder else None


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


@click.command("fit")
@click.argument("source")
@click.argument("target")
@click.option("--corpus", required=True, type=click.Path(exists=False), help="Text file, JSONL with a 'text' field, or folder of .txt files.")
@click.option("--out", required=True, type=click.Path(), help="Mapping folder to write (mapping.safetensors + manifest.json).")
@click.option("--fitter", default="ridge", show_default=True, help="Fitter plugin (ridge, ridge-headwise, sklearn, ...).")
@click.option("--top-k", default=4, show_default=True, help="Source layers per target layer (ridge, sklearn).")
@click.option("--seq-len", default=512, show_default=True, help="Tokens per calibration sequence.")
@click.option("--tokens", default=None, type=int, help="Calibration tokens to read (default: the whole corpus).")
@click.option("--stride", default=4, show_default=True, help="Keep every stride-th position of each sequence.")
@click.option("--skip", default=0, show_default=True, help="Drop the first N positions of each sequence (attention sinks).")
@click.option("--alpha", default="0.01", show_default=True, help="Ridge strength, or 'auto' (chosen on the held-out split).")
@click.option("--heldout", default=0.1, show_default=True, help="Share of sequences held out for R² (and --alpha auto).")
@click.option("--seed", default=0, show_default=True, help="Seed of the position sampling and the held-out split.")
@click.option("--batch-size", default=4, show_default=True, help="Sequences per forward pass.")
@click.option("--estimator", default=None, help="sklearn fitter: 'module:Class' (e.g. sklearn.linear_model:RidgeCV).")
@click.option("--estimator-options", default=None, help="sklearn fitter: JSON options of the estimator.")
@click.option("--max-samples", default=100_000, show_default=True, help="sklearn fitter: cap on materialised observations.")
@click.option("--memory", "memory_gib", default=None, type=float, help="Statistics memory budget in GiB (default 8 or $KVBRIDGE_FIT_MEMORY).")
@click.option("--dtype", default="float32", type=click.Choice(DTYPES), show_default=True, help="Dtype to load the models in.")
@click.option("--resume", is_flag=True, help="Keep resumable statistics in .<out>.fitstate/ beside --out (checksummed; removed on success) "
                                          "and continue an interrupted fit from them.")
@click.option("--force", is_flag=True, help="Replace an existing --out folder.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def fit(source, target, corpus, out, fitter, top_k, seq_len, tokens, stride, skip, alpha, heldout, seed, batch_size,
        estimator, estimator_options, max_samples, memory_gib, dtype, resume, force, quiet):
    """Fit a mapping from SOURCE's KV cache to TARGET's on a calibration corpus.

    SOURCE and TARGET are local model folders (or models in the Hugging Face cache, offline)
    with identical tokenizers. Both read the same token ids; per layer their RoPE-stripped
    keys and values are sampled every --stride positions and accumulated into float64
    statistics; the fitter selects source layers and solves per target (layer, KV head), K
    and V apart. The folder --out gets mapping.safetensors and manifest.json (held-out R²
    per target head, fingerprints of both models, calibration details), written atomically.

    Distributed: `torchrun --nproc-per-node N -m kvbridge fit ...` shards the corpus over
    ranks and all-reduces the statistics; rank 0 writes. With --resume, checkpoints are kept in
    .<out>.fitstate next to --out and a rerun with --resume continues from them; without it
    nothing but --out is ever written.
    """
    from pathlib import Path

    from kvbridge.artifacts import check_replaceable
    from kvbridge.check import validate
    from kvbridge.fit.artifact import KIND
    from kvbridge.fit.calibrate import check_same_tokens, load_corpus

    check_replaceable(out, KIND, overwrite=force)  # a mapping only ever replaces a mapping kvbridge wrote
    alpha = validate.alpha(alpha)
    validate.memory_gib(memory_gib)
    validate.seq_len(seq_len)
    validate.tokens(tokens)
    validate.stride(stride, seq_len, skip=validate.non_negative_int(skip, "--skip"))
    texts, sha = load_corpus(corpus)
    t0 = time.perf_counter()
    src, tgt = resolve_folder(source), resolve_folder(target)
    tok_fp = tokenizer_pair(src, tgt)  # before loading any weights: refuse early
    src, smodel, stok = load_model(src, dtype=dtype)
    tgt, tmodel, ttok = load_model(tgt, dtype=dtype)
    check_same_tokens(texts, stok, ttok)

    from kvbridge.fit import distributed as dist_mod
    from kvbridge.fit.pipeline import fit as run_fit

    ctx = dist_mod.setup()
    main = ctx is None or ctx.is_main
    options = {}
    if fitter == "sklearn":
        options = {"estimator": estimator, "estimator_options": estimator_options, "max_samples": max_samples}
    mapping = run_fit(smodel, tmodel, texts, fitter=fitter, top_k=top_k, alpha=alpha, seq_len=seq_len, tokens=tokens,
                      stride=stride, skip=skip, heldout=heldout, seed=seed, batch_size=batch_size,
                      memory_budget=None if memory_gib is None else int(memory_gib * 2**30), tokenizer=stok,
                      tokenizer_fingerprint=tok_fp, corpus_sha256=sha, corpus_path=corpus, out=out, force=force, resume=resume,
                      source_name=src.name, target_name=tgt.name, source_revision=_revision(src),
                      target_revision=_revision(tgt), progress=Progress(main and not quiet, ctx.world if ctx else 1),
                      distributed=ctx, **options)
    if not main:
        return
    rep = mapping.report
    cal = mapping.manifest.get("calibration", {})
    summ = rep.get("r2_summary", {})
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
    for w in rep.get("warnings", []):
        click.echo(f"warning: {w}", err=True)
