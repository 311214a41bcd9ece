"""``fit(...)``: the whole fitting run behind ``kvbridge fit``, as one Python call.

source + target models, calibration data (token ids, texts or a corpus path)
-> paired calibration -> the fitter plugin (statistics, selection, solves)
-> a :class:`~kvbridge.fit.mapping.FittedMapping` with its manifest
-> (``out``) an atomically written mapping folder, by rank 0 only when distributed.
"""

from __future__ import annotations

import hashlib
from contextlib import nullcontext
from dataclasses import asdict, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable

from kvbridge.fit.settings import MIN_OBS_PER_FEATURE, parse_top_k
from kvbridge.fit.solve import FitError


def sweep_labels(top_k, layers: int | None) -> list:
    """``[(label, k), ...]`` of top-k values (``4``, ``"1,2,all"``, ``[1, "all"]``; ``all``: ``layers``),
    each checked against the source's ``layers``."""
    from kvbridge.check import validate as v

    parsed = parse_top_k(top_k)
    values = parsed if isinstance(parsed, list) else [parsed]
    if "all" in values and layers is None:
        raise FitError("--top-k all needs the source model's layer count", "give numbers instead")
    return [(str(val), layers if val == "all" else v.top_k(int(val), layers)) for val in values]


def prepare_sequences(
    data: Any, *, tokenizer=None, seq_len: int | None = None, tokens: int | None = None, offset: int = 0
):
    """``(sequences [N, L], corpus_sha256 or None, texts or None)`` from ids, texts or a corpus path
    (``offset``: tokens skipped first; for ids, whole sequences: ``offset // L`` of them)."""
    import torch

    from kvbridge.corpus import load_corpus
    from kvbridge.fit.calibrate import CalibrationError, tokenize_corpus

    if isinstance(data, torch.Tensor):
        seqs = data.long()
        if seqs.dim() == 1:
            if not seq_len:
                raise CalibrationError("1-D token ids need seq_len to cut them into sequences", "pass seq_len=")
            n = seqs.numel() // seq_len
            seqs = seqs[: n * seq_len].view(n, seq_len)
        if offset:
            seqs = seqs[int(offset) // seqs.shape[1] :]
            if seqs.shape[0] == 0:
                raise CalibrationError(
                    f"--tokens-offset {offset} skips every calibration sequence", "use a smaller one"
                )
        if tokens is not None:
            seqs = seqs[: max(1, int(tokens) // seqs.shape[1])]
        return seqs, None, None
    if isinstance(data, (str, Path)):
        texts, sha = load_corpus(data)
    elif isinstance(data, (list, tuple)) and all(isinstance(t, str) for t in data):
        texts = list(data)
        sha = hashlib.sha256("\0".join(texts).encode()).hexdigest()
    else:
        raise CalibrationError(
            f"calibration data must be token ids, texts or a corpus path, got {type(data).__name__}",
            "pass a [sequences, seq_len] tensor, a list of strings or a path",
        )
    if tokenizer is None:
        raise CalibrationError(
            "text calibration data needs a tokenizer", "pass tokenizer= (the models' shared tokenizer)"
        )
    return tokenize_corpus(texts, tokenizer, seq_len=seq_len or 512, tokens=tokens, offset=offset), sha, texts


def identity(run, role: str) -> dict:
    """The manifest identity (spec, fingerprints, RoPE) of ``run``'s ``"source"`` or ``"target"``,
    computed once per run (a fit's manifest and a mapping check read the same one)."""
    from kvbridge.fit.artifact import model_identity

    loaded = getattr(run, role)

    def compute():
        ref = loaded.ref  # a Hugging Face cache snapshot's folder name is its commit
        snapshot = Path(ref.folder).name if getattr(ref, "kind", None) == "hf-cache" and ref.folder else None
        revision = getattr(loaded, "revision", None) or snapshot
        return model_identity(loaded.model, host=run.host, name=loaded.name, revision=revision)

    return run.once(f"identity.{role}", compute)


def fitter_options(fitter_obj, options=None, **values):
    """The fitter's options dataclass from ``options`` (an instance, a mapping or ``-o`` pairs)
    updated by ``values``; unknown keys are refused naming the closest ones."""
    from kvbridge.fit.protocol import build_options

    if isinstance(options, fitter_obj.Options) and not values:
        return options
    return build_options(fitter_obj.Options, {**option_base(options), **values}, owner=f"fitter {fitter_obj.name!r}")


def option_base(options) -> dict:
    """Fitter option values given in Python: an options dataclass, a mapping or ``["key=value", ...]``."""
    from kvbridge.fit.protocol import parse_pairs

    if options is None:
        return {}
    if is_dataclass(options):
        return asdict(options)
    return parse_pairs(options) if isinstance(options, (list, tuple)) else dict(options)


def execute(run, job, *, progress: Callable | None = None, distributed: Any = "auto"):
    """Run a resolved fit (:class:`~kvbridge.fit.run.FitJob`) on ``run``'s models and settings: an
    ``out`` that cannot be replaced is refused before any work and locked to the end (rank 0 writes
    and locks)."""
    from kvbridge.artifacts import check_replaceable, output_lock
    from kvbridge.fit import distributed as dist_mod
    from kvbridge.fit.artifact import KIND

    s = run.settings
    if s.out is not None:
        check_replaceable(s.out, SWEEP_KIND if job.sweep is not None else KIND, overwrite=s.overwrite)
    ctx = dist_mod.setup() if distributed == "auto" else distributed
    writes = s.out is not None and (ctx is None or ctx.is_main)
    with output_lock(s.out) if writes else nullcontext():
        return _execute(run, job, progress, ctx)


def _execute(run, job, progress, ctx):
    """The fit itself: paired calibration, the fitter (one mapping, or every k of a sweep from one
    pass), the manifests, and the write."""
    import torch

    from kvbridge.artifacts import atomic_dir
    from kvbridge.corpus import calibration_span, corpus_record
    from kvbridge.fit import distributed as dist_mod
    from kvbridge.fit.calibrate import PairedCalibration
    from kvbridge.fit.keep import KIND as STATS_KIND, StatsWriter

    s, config, opts, fitter_obj, sweep = run.settings, job.calibration, job.options, job.fitter, job.sweep
    tokenizer, fingerprint = run.source.tokenizer, run.tokenizer or None  # None: models given in Python
    seqs, sha, texts = prepare_sequences(
        job.data, tokenizer=tokenizer, seq_len=config.seq_len, tokens=config.tokens, offset=config.offset
    )
    source_id, target_id = identity(run, "source"), identity(run, "target")
    token_sha = hashlib.sha256(seqs.contiguous().numpy().tobytes()).hexdigest()  # the ids, hashed once
    params = {"fitter": s.fitter, **asdict(opts)}
    world = ctx.world if ctx else 1
    checkpoint = None
    if s.resume:  # resumable state is kept only when asked for, in .<out>.fitstate/ beside --out
        if s.out is None:
            raise FitError("--resume needs a checkpoint folder", "pass --out (checkpoints live beside it)")
        key = {
            "source": [source_id["config_fingerprint"], source_id["weights_fingerprint"]],
            "target": [target_id["config_fingerprint"], target_id["weights_fingerprint"]],
            "token_ids_sha256": token_sha,
            "calibration": asdict(config),
            "params": params,
            "world": world,
        }
        ck_dir = dist_mod.default_checkpoint_dir(s.out)
        checkpoint = dist_mod.Checkpoint(ck_dir, key, resume=True, every_s=job.checkpoint_every)
    cal = PairedCalibration(
        run.source.model,
        run.target.model,
        seqs,
        config,
        host=run.host,
        progress=progress,
        checkpoint=checkpoint,
        dist=ctx,
    )
    calib = {
        **cal.describe(),
        "corpus_sha256": job.corpus_sha256 or sha,
        "token_ids_sha256": token_sha,
        "world_size": world,
    }
    if job.corpus_path is not None:  # its hash; a folder's split by file (job.split: texts are its calibration part)
        calib["corpus"] = corpus_record(job.corpus_path, job.split)
        calib["corpus_sha256"] = calib["corpus"]["sha256"]
    if texts is not None and tokenizer is not None:
        # the span runs from the corpus start through the last token used (an offset chunk counts what it skipped)
        calib["span"] = calibration_span(list(texts), tokenizer, int(seqs.numel()) + config.offset)
    main = ctx is None or ctx.is_main
    keeping = s.keep_stats is not None and main
    if (sweep is not None or s.keep_stats is not None) and not hasattr(fitter_obj, "fit_sweep"):
        raise FitError(
            f"the {s.fitter} fitter cannot {'sweep --top-k' if sweep is not None else 'keep statistics'}",
            "use --fitter ridge, or one --top-k and no --keep-stats",
        )
    keep_ctx = atomic_dir(s.keep_stats, kind=STATS_KIND, overwrite=s.overwrite) if keeping else nullcontext()
    with torch.no_grad(), keep_ctx as keep_tmp:
        base = {"source": source_id, "target": target_id, "tokenizer": fingerprint, "calibration": calib}
        writer = StatsWriter(keep_tmp, {**base, "params": params}) if keeping else None
        if sweep is None and writer is None:
            mappings = {None: fitter_obj.fit(cal.source_spec, cal.target_spec, cal, opts)}
        else:
            labels = sweep or [(str(opts.top_k), opts.top_k)]
            by_k = fitter_obj.fit_sweep(
                cal.source_spec, cal.target_spec, cal, opts, [k for _, k in labels], keep=writer
            )
            mappings = by_label(by_k, labels, cal.source_spec.num_layers, sweep is not None)
    first = next(iter(mappings.values()))
    if not hasattr(first, "tensors"):  # the identity baseline: nothing to store
        if s.out is not None:
            raise FitError(f"the {s.fitter} fitter makes no artifact", "use it through kvbridge.transfer directly")
        return first
    calib["forward_seconds"] = round(cal.seconds, 3)
    for mapping in mappings.values():
        finish_mapping(mapping, source=source_id, target=target_id, tokenizer=fingerprint, calibration=calib)
    if s.out is not None:
        if main:
            from kvbridge.faults import fault_point

            fault_point("fit.save")
            write_mappings(mappings, s.out, overwrite=s.overwrite)
        dist_mod.barrier(ctx)  # every rank has finished with its checkpoint
        if checkpoint is not None and main:
            checkpoint.clear()
    return mappings[None] if None in mappings else mappings


#: the kind of a folder holding one mapping per k (``--top-k 1,2,4``) and of kept statistics
SWEEP_KIND = "kvbridge-mapping-sweep"


def by_label(by_k: dict, labels, layers: int, sweep: bool) -> dict:
    """``{label: mapping}`` of a sweep's ``(label, k)`` s (``{None: mapping}`` of one k) from ``{k: mapping}``."""
    if not sweep:
        return {None: by_k[min(labels[0][1], layers)]}
    return {label: by_k[min(k, layers)] for label, k in labels}


def sweep_folder(label) -> str:
    """The subfolder of a k sweep's ``--out`` that holds the mapping of ``label`` (``k4``, ``kall``)."""
    return f"k{label}"


def write_mappings(mappings: dict, out, *, overwrite: bool = False) -> None:
    """``{None: mapping}``: one mapping folder; ``{label: mapping}``: one folder holding ``k<label>/``
    for each (written into a temporary folder and renamed into place at once)."""
    from kvbridge.artifacts import atomic_dir
    from kvbridge.fit.artifact import save_mapping

    if None in mappings:
        save_mapping(mappings[None], out, force=overwrite)
        return
    with atomic_dir(out, kind=SWEEP_KIND, overwrite=overwrite) as tmp:
        for label, mapping in mappings.items():
            save_mapping(mapping, Path(tmp) / sweep_folder(label))


def finish_mapping(mapping, *, source: dict, target: dict, tokenizer: dict | None, calibration: dict) -> None:
    """Observations-per-feature warning and the manifest of a fitted mapping (in place)."""
    from kvbridge.fit.artifact import build_manifest

    calib = dict(calibration)
    feats = (getattr(mapping.report, "observations", None) or {}).get("features_per_head")
    if feats and "observations_train" in calib:
        ratio = calib["observations_train"] / feats
        calib["features_per_head"], calib["observations_per_feature"] = int(feats), round(ratio, 3)
        calib["min_observations_per_feature"] = MIN_OBS_PER_FEATURE
        if ratio < MIN_OBS_PER_FEATURE:
            warn = (
                f"only {ratio:.1f} training observations per feature ({calib['observations_train']} per target "
                f"head for {feats} features; at least {MIN_OBS_PER_FEATURE} recommended): held-out R² will be "
                f"low and seed-dependent; calibrate on more --tokens, a smaller --stride or --top-k, or "
                f"ridge-headwise"
            )
            mapping.report = replace(mapping.report, warnings=tuple(mapping.report.warnings) + (warn,))
    mapping.manifest = build_manifest(mapping, source=source, target=target, tokenizer=tokenizer, calibration=calib)


def fit_from_stats(
    folder,
    *,
    out=None,
    top_k=None,
    alpha=None,
    low_r2=None,
    source=None,
    target=None,
    overwrite: bool = False,
    host=None,
):
    """Solve mappings again from statistics kept by ``fit(..., keep_stats=DIR)``: no models, no forwards.

    ``top_k``: one value or a list (each at most the kept ``max_k``, default it); ``alpha``,
    ``low_r2``: default the kept fit's. ``source`` / ``target``: the models or configs the result
    is meant for (identity dicts, configs or models); kept statistics of other models are
    refused naming the field. Returns a mapping, or ``{label: mapping}`` for a list; with ``out``
    they are written (one folder, or one ``k<label>/`` per k).
    """
    from kvbridge.fit.artifact import as_identity
    from kvbridge.fit.keep import check_models, load_statistics, merge_statistics
    from kvbridge.fit.ridge import RidgeFitter, RidgeOptions

    if isinstance(folder, (list, tuple)):
        folders = list(folder)
    else:
        folders = [f for f in (folder.split(",") if isinstance(folder, str) else [folder]) if str(f).strip()]
    # kept chunks of several runs (--tokens-offset) are merged into one fit
    stats, manifest = merge_statistics(folders) if len(folders) > 1 else load_statistics(folders[0])
    check_models(manifest, folders[0], source=as_identity(source, host), target=as_identity(target, host))
    params = dict(manifest.get("params") or {})
    base = RidgeOptions(**{k: params[k] for k in ("alpha", "low_r2") if k in params}, top_k=stats.max_k)
    values = {k: v for k, v in (("alpha", alpha), ("low_r2", low_r2)) if v is not None}
    opts = fitter_options(RidgeFitter(), base, **values) if values else base  # values coerced and checked
    ls = stats.source_spec.num_layers
    labels = sweep_labels(stats.max_k if top_k is None else top_k, ls)  # one label ("all" alone too): one mapping
    by_k = RidgeFitter().solve(stats, opts, [k for _, k in labels])
    calib = dict(manifest.get("calibration") or {})
    calib["from_stats"] = {
        "folder": ",".join(str(f) for f in folders),
        "manifest_created": manifest.get("created"),
    }
    mappings = by_label(by_k, labels, ls, len(labels) > 1)
    ids = {"source": manifest["source"], "target": manifest["target"], "tokenizer": manifest.get("tokenizer")}
    for mapping in mappings.values():
        finish_mapping(mapping, **ids, calibration=calib)
    if out is not None:
        write_mappings(mappings, out, overwrite=overwrite)
    return mappings[None] if None in mappings else mappings


__all__ = [
    "execute",
    "identity",
    "fit_from_stats",
    "prepare_sequences",
    "fitter_options",
    "parse_top_k",
    "write_mappings",
    "sweep_folder",
    "SWEEP_KIND",
]
