"""``fit(...)``: the whole fitting run behind ``kvbridge fit``, as one Python call.

source + target models, calibration data (token ids, texts or a corpus path)
-> paired calibration -> the fitter plugin (statistics, selection, solves)
-> a :class:`~kvbridge.fit.mapping.FittedMapping` with its manifest
-> (``out``) an atomically written mapping folder, by rank 0 only when distributed.
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

from kvbridge.fit.calibrate import CalibrationConfig
from kvbridge.fit.solve import FitError


def _token_sha(seqs) -> str:
    return hashlib.sha256(seqs.contiguous().numpy().tobytes()).hexdigest()


def prepare_sequences(data: Any, *, tokenizer=None, seq_len: int | None = None, tokens: int | None = None):
    """``(sequences [N, L], corpus_sha256 or None, texts or None)`` from ids, texts or a corpus path."""
    import torch

    from kvbridge.fit.calibrate import CalibrationError, load_corpus, tokenize_corpus

    if isinstance(data, torch.Tensor):
        seqs = data.long()
        if seqs.dim() == 1:
            if not seq_len:
                raise CalibrationError("1-D token ids need seq_len to cut them into sequences", "pass seq_len=")
            n = seqs.numel() // seq_len
            seqs = seqs[: n * seq_len].view(n, seq_len)
        if tokens is not None:
            seqs = seqs[: max(1, int(tokens) // seqs.shape[1])]
        return seqs, None, None
    if isinstance(data, (str, Path)):
        texts, sha = load_corpus(data)
    elif isinstance(data, (list, tuple)) and all(isinstance(t, str) for t in data):
        texts = list(data)
        sha = hashlib.sha256("\0".join(texts).encode()).hexdigest()
    else:
        raise CalibrationError(f"calibration data must be token ids, texts or a corpus path, got {type(data).__name__}",
                               "pass a [sequences, seq_len] tensor, a list of strings or a path")
    if tokenizer is None:
        raise CalibrationError("text calibration data needs a tokenizer", "pass tokenizer= (the models' shared tokenizer)")
    return tokenize_corpus(texts, tokenizer, seq_len=seq_len or 512, tokens=tokens), sha, texts


@dataclass(frozen=True)
class Provenance:
    """Names and revisions recorded in the manifest (``kvbridge fit`` fills them from the refs)."""

    source_name: str = ""
    target_name: str = ""
    source_revision: str | None = None
    target_revision: str | None = None


def load_fitter(host, name: str):
    """The fitter instance registered as ``name`` (a one-line error with suggestions otherwise);
    the loaded class is checked against :class:`~kvbridge.fit.protocol.FitterProtocol`."""
    from kvbridge.plugin_types import load_registered

    cls = load_registered("fitter", name, host.fitter(name), host.owner("fitter", name))
    return cls() if isinstance(cls, type) else cls


def fitter_options(fitter_obj, options=None, **values):
    """The fitter's options dataclass from ``options`` (an instance, a mapping or ``-o`` pairs)
    updated by ``values``; unknown keys are refused naming the closest ones."""
    from kvbridge.fit.protocol import build_options, parse_pairs

    cls = fitter_obj.Options
    owner = f"fitter {fitter_obj.name!r}"
    if isinstance(options, cls):
        base = {k: v for k, v in asdict(options).items()}
        return build_options(cls, {**base, **values}, owner=owner) if values else options
    if isinstance(options, (list, tuple)):
        options = parse_pairs(options)
    return build_options(cls, {**dict(options or {}), **values}, owner=owner)


_CALIBRATION_KEYS = {f.name for f in fields(CalibrationConfig)}
_PROVENANCE_KEYS = {f.name for f in fields(Provenance)}


def _split_overrides(overrides: dict, calibration, provenance):
    """Keyword shortcuts: calibration fields, provenance fields and fitter options by name."""
    cal = {k: overrides.pop(k) for k in list(overrides) if k in _CALIBRATION_KEYS}
    prov = {k: overrides.pop(k) for k in list(overrides) if k in _PROVENANCE_KEYS}
    calibration = calibration or CalibrationConfig()
    if cal:
        calibration = replace(calibration, **cal)
    provenance = replace(provenance or Provenance(), **prov)
    return calibration, provenance, overrides


def _fit(source_model, target_model, data, *, fitter: str = "ridge", options=None,
        calibration: CalibrationConfig | None = None, tokenizer=None, target_tokenizer=None,
        tokenizer_fingerprint: dict | None = None, corpus_sha256: str | None = None,
        corpus_path: str | Path | None = None,
        out: str | Path | None = None, overwrite: bool = False, resume: bool = False,
        checkpoint_dir: str | Path | None = None, checkpoint_every: float = 60.0,
        provenance: Provenance | None = None, progress: Callable | None = None, distributed: Any = "auto",
        host=None, **overrides):
    """Fit a mapping from ``source_model``'s cache to ``target_model``'s (see ``kvbridge fit --help``).

    ``data``: ``[sequences, seq_len]`` token ids, a list of texts, or a corpus path (text file,
    JSONL with ``text``, folder of .txt) with ``tokenizer`` (give ``target_tokenizer`` too and
    the two are checked to produce the same ids). ``calibration``: a
    :class:`~kvbridge.fit.calibrate.CalibrationConfig` (stride, skip, held-out share, seed,
    batch size, sequence length, token budget). ``options``: the fitter's options dataclass,
    a mapping or ``["key=value", ...]``. Keyword ``overrides`` name a calibration field
    (``stride=2``), a :class:`Provenance` field or a fitter option (``top_k=2``); anything
    else is refused with the closest names. Returns the
    :class:`~kvbridge.fit.mapping.FittedMapping` (its ``report`` a
    :class:`~kvbridge.fit.protocol.FitReport`); with ``out`` it is also written.
    """
    import torch

    from kvbridge.fit import distributed as dist_mod
    from kvbridge.fit.artifact import build_manifest, model_identity, save_mapping
    from kvbridge.fit.calibrate import MIN_OBS_PER_FEATURE, PairedCalibration
    from kvbridge.plugins import get_host

    if "force" in overrides:  # the old name of overwrite
        warnings.warn("fit(force=...) is deprecated: use overwrite=", DeprecationWarning, stacklevel=2)
        overwrite = bool(overrides.pop("force")) or overwrite
    host = host or get_host()
    config, prov, overrides = _split_overrides(dict(overrides), calibration, provenance)
    fitter_obj = load_fitter(host, fitter)
    opts = fitter_options(fitter_obj, options, **overrides)
    _validate(source_model, target_model, config, opts)
    ctx = dist_mod.setup() if distributed == "auto" else distributed
    seqs, sha, texts = prepare_sequences(data, tokenizer=tokenizer, seq_len=config.seq_len, tokens=config.tokens)
    if texts is not None and target_tokenizer is not None and target_tokenizer is not tokenizer:
        from kvbridge.fit.calibrate import check_same_tokens

        check_same_tokens(texts, tokenizer, target_tokenizer)  # paired calibration needs identical ids
    source_id = model_identity(source_model, host=host, name=prov.source_name, revision=prov.source_revision)
    target_id = model_identity(target_model, host=host, name=prov.target_name, revision=prov.target_revision)
    data_sha = corpus_sha256 or sha
    params = {"fitter": fitter, **asdict(opts)}
    checkpoint = None
    # resumable state is kept only when asked for (--resume), in .<out>.fitstate/ beside --out
    ck_dir = checkpoint_dir or (dist_mod.default_checkpoint_dir(out) if out is not None and resume else None)
    if ck_dir is not None:
        key = {"source": [source_id["config_fingerprint"], source_id["weights_fingerprint"]],
               "target": [target_id["config_fingerprint"], target_id["weights_fingerprint"]],
               "token_ids_sha256": _token_sha(seqs), "calibration": asdict(config), "params": params,
               "world": ctx.world if ctx else 1}
        checkpoint = dist_mod.Checkpoint(ck_dir, key, resume=resume, every_s=checkpoint_every)
    elif resume:
        raise FitError("--resume needs a checkpoint folder", "pass --out (checkpoints live beside it)")
    cal = PairedCalibration(source_model, target_model, seqs, config, host=host, progress=progress,
                            checkpoint=checkpoint, dist=ctx)
    with torch.no_grad():
        mapping = fitter_obj.fit(cal.source_spec, cal.target_spec, cal, opts)
    if not hasattr(mapping, "tensors"):  # the identity baseline: nothing to store
        if out is not None:
            raise FitError(f"the {fitter} fitter makes no artifact", "use it through kvbridge.transfer directly")
        return mapping
    calib = {**cal.describe(), "corpus_sha256": data_sha, "token_ids_sha256": _token_sha(seqs),
             "world_size": ctx.world if ctx else 1, "forward_seconds": round(cal.seconds, 3)}
    calib.update(_corpus_provenance(corpus_path, texts, tokenizer, int(seqs.numel())))
    feats = (getattr(mapping.report, "observations", None) or {}).get("features_per_head")
    if feats:
        ratio = calib["observations_train"] / feats
        calib["features_per_head"], calib["observations_per_feature"] = int(feats), round(ratio, 3)
        calib["min_observations_per_feature"] = MIN_OBS_PER_FEATURE
        if ratio < MIN_OBS_PER_FEATURE:
            import dataclasses

            warn = (f"only {ratio:.1f} training observations per feature ({calib['observations_train']} per target "
                    f"head for {feats} features; at least {MIN_OBS_PER_FEATURE} recommended): held-out R² will be "
                    f"low and seed-dependent; calibrate on more --tokens, a smaller --stride or --top-k, or "
                    f"ridge-headwise")
            mapping.report = dataclasses.replace(mapping.report, warnings=tuple(mapping.report.warnings) + (warn,))
    mapping.manifest = build_manifest(mapping, source=source_id, target=target_id, tokenizer=tokenizer_fingerprint,
                                      calibration=calib)
    if out is not None:
        if ctx is None or ctx.is_main:
            from kvbridge.faults import fault_point

            fault_point("fit.save")
            save_mapping(mapping, out, force=overwrite)
        dist_mod.barrier(ctx)  # every rank has finished with its checkpoint
        if checkpoint is not None and (ctx is None or ctx.is_main):
            checkpoint.clear()
    return mapping


def _validate(source_model, target_model, config, opts) -> None:
    """Run options through the one validation layer (kvbridge.check.validate) before any work."""
    from kvbridge.check import validate as v

    smax = getattr(source_model.config, "max_position_embeddings", None)
    tmax = getattr(target_model.config, "max_position_embeddings", None)
    max_pos = min([m for m in (smax, tmax) if isinstance(m, int) and m > 0], default=None)
    layers = getattr(source_model.config, "num_hidden_layers", None)
    if getattr(opts, "top_k", None) is not None:
        v.top_k(opts.top_k, layers if isinstance(layers, int) else None)
    if config.seq_len is not None:
        v.seq_len(config.seq_len, max_pos)
        v.stride(config.stride, config.seq_len, skip=config.skip)
    v.tokens(config.tokens)
    alpha = getattr(opts, "alpha", None)
    if alpha is not None and not isinstance(alpha, (list, tuple)):
        v.alpha(alpha)
    budget = getattr(opts, "memory_budget", None)
    if budget is not None:
        v.finite_number(budget, "--memory", positive=True, fix="pass a budget in GiB, e.g. --memory 8")


def _corpus_provenance(corpus_path, texts, tokenizer, used_tokens: int) -> dict:
    """The corpus file hashes (as ``sha256sum`` prints them) and the span calibration read."""
    out = {}
    if corpus_path is not None:
        from kvbridge.fit.calibrate import corpus_record

        out["corpus"] = corpus_record(corpus_path)
        out["corpus_sha256"] = out["corpus"]["sha256"]
    if texts is not None and tokenizer is not None:
        from kvbridge.fit.calibrate import calibration_span

        out["span"] = calibration_span(list(texts), tokenizer, used_tokens)
    return out


@functools.wraps(_fit)
def fit(source_model, target_model, data, **kwargs):
    out = kwargs.get("out")
    if out is None:
        return _fit(source_model, target_model, data, **kwargs)
    from kvbridge.artifacts import check_replaceable, output_lock
    from kvbridge.fit import distributed as dist_mod
    from kvbridge.fit.artifact import KIND

    overwrite = bool(kwargs.get("overwrite") or kwargs.get("force"))
    check_replaceable(out, KIND, overwrite=overwrite)  # refuse before any work; the lock is held to the end
    if kwargs.get("distributed", "auto") == "auto":
        kwargs["distributed"] = dist_mod.setup()
    ctx = kwargs["distributed"]
    if ctx is not None and not ctx.is_main:  # rank 0 writes (and locks)
        return _fit(source_model, target_model, data, **kwargs)
    with output_lock(out):
        return _fit(source_model, target_model, data, **kwargs)


__all__ = ["fit", "prepare_sequences", "load_fitter", "fitter_options", "Provenance"]
