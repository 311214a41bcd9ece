"""``fit(...)``: the whole fitting run behind ``kvbridge fit``, as one Python call.

source + target models, calibration data (token ids, texts or a corpus path)
-> paired calibration -> the fitter plugin (statistics, selection, solves)
-> a :class:`~kvbridge.fit.mapping.FittedMapping` with its manifest
-> (``out``) an atomically written mapping folder, by rank 0 only when distributed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable

from kvbridge.errors import ArtifactError
from kvbridge.fit.ridge import DEFAULT_ALPHA, FitError


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


def load_fitter(host, name: str):
    """The fitter instance registered as ``name`` (a one-line error with suggestions otherwise)."""
    return host.fitter(name).load()()


def fit(source_model, target_model, data, *, fitter: str = "ridge", top_k: int = 4, alpha=DEFAULT_ALPHA,
        seq_len: int | None = None, tokens: int | None = None, stride: int = 4, skip: int = 0,
        heldout: float = 0.1, seed: int = 0, batch_size: int = 4, memory_budget: int | None = None,
        tokenizer=None, target_tokenizer=None, tokenizer_fingerprint: dict | None = None,
        corpus_sha256: str | None = None, corpus_path: str | Path | None = None,
        out: str | Path | None = None, force: bool = False, resume: bool = False,
        checkpoint_dir: str | Path | None = None, checkpoint_every: float = 60.0,
        source_name: str = "", target_name: str = "", source_revision: str | None = None,
        target_revision: str | None = None, progress: Callable | None = None, distributed: Any = "auto",
        host=None, **fitter_options):
    """Fit a mapping from ``source_model``'s cache to ``target_model``'s (see ``kvbridge fit --help``).

    ``data``: ``[sequences, seq_len]`` token ids, a list of texts, or a corpus path (text file,
    JSONL with ``text``, folder of .txt) with ``tokenizer`` (give ``target_tokenizer`` too and
    the two are checked to produce the same ids). ``fitter_options`` go to the
    fitter (``estimator=``, ``estimator_options=``, ``max_samples=`` for ``sklearn``).
    Returns the :class:`~kvbridge.fit.mapping.FittedMapping`; with ``out`` it is also written.
    """
    from kvbridge.plugins import get_host

    host = host or get_host()
    fitter_options = dict(fitter_options)
    if out is None:
        return _fit(source_model, target_model, data, locals())
    from kvbridge.artifacts import check_replaceable, output_lock
    from kvbridge.fit.artifact import KIND

    from kvbridge.fit import distributed as dist_mod

    check_replaceable(out, KIND, overwrite=force)  # refuse before any work; the lock is held to the end
    if distributed == "auto":
        distributed = dist_mod.setup()
    if distributed is not None and not distributed.is_main:  # rank 0 writes (and locks)
        return _fit(source_model, target_model, data, locals())
    with output_lock(out):
        return _fit(source_model, target_model, data, locals())


def _validate_options(kw: dict, source_spec_layers: int | None, max_positions: int | None) -> None:
    from kvbridge.check import validate as v

    v.top_k(kw["top_k"], source_spec_layers)
    if kw["seq_len"] is not None:
        v.seq_len(kw["seq_len"], max_positions)
    v.tokens(kw["tokens"])
    v.non_negative_int(kw["skip"], "--skip")
    v.positive_int(kw["batch_size"], "--batch-size")
    if kw["seq_len"] is not None:
        v.stride(kw["stride"], kw["seq_len"], skip=kw["skip"])
    if kw["alpha"] is not None:
        v.alpha(kw["alpha"])
    if kw["memory_budget"] is not None:
        v.finite_number(kw["memory_budget"], "--memory", positive=True, fix="pass a budget in GiB, e.g. --memory 8")


def _fit(source_model, target_model, data, kw: dict):
    """The body of :func:`fit` (``kw``: its arguments), run under the output lock when writing."""
    import torch

    from kvbridge.fit import distributed as dist_mod
    from kvbridge.fit.artifact import build_manifest, model_identity, save_mapping
    from kvbridge.fit.calibrate import MIN_OBS_PER_FEATURE, CalibrationConfig, PairedCalibration

    g = dict(kw)
    fitter, top_k, alpha, seq_len, tokens = g["fitter"], g["top_k"], g["alpha"], g["seq_len"], g["tokens"]
    stride, skip, heldout, seed, batch_size = g["stride"], g["skip"], g["heldout"], g["seed"], g["batch_size"]
    memory_budget, tokenizer, target_tokenizer = g["memory_budget"], g["tokenizer"], g["target_tokenizer"]
    out, force, resume, host, progress = g["out"], g["force"], g["resume"], g["host"], g["progress"]
    fitter_options = g["fitter_options"]
    smax = getattr(source_model.config, "max_position_embeddings", None)
    tmax = getattr(target_model.config, "max_position_embeddings", None)
    max_pos = min([m for m in (smax, tmax) if isinstance(m, int) and m > 0], default=None)
    n_src_layers = getattr(source_model.config, "num_hidden_layers", None)
    _validate_options(g, n_src_layers if isinstance(n_src_layers, int) else None, max_pos)
    distributed = g["distributed"]
    ctx = dist_mod.setup() if distributed == "auto" else distributed
    fitter_obj = load_fitter(host, fitter)
    seqs, sha, texts = prepare_sequences(data, tokenizer=tokenizer, seq_len=seq_len, tokens=tokens)
    if texts is not None and target_tokenizer is not None and target_tokenizer is not tokenizer:
        from kvbridge.fit.calibrate import check_same_tokens

        check_same_tokens(texts, tokenizer, target_tokenizer)  # paired calibration needs identical ids
    config = CalibrationConfig(stride=int(stride), skip=int(skip), heldout=float(heldout), seed=int(seed),
                               batch_size=int(batch_size))
    source_id = model_identity(source_model, host=host, name=g["source_name"], revision=g["source_revision"])
    target_id = model_identity(target_model, host=host, name=g["target_name"], revision=g["target_revision"])
    data_sha = g["corpus_sha256"] or sha
    params = {"fitter": fitter, "top_k": int(top_k), "alpha": alpha, "memory_budget": memory_budget,
              **{k: v for k, v in fitter_options.items()}}
    checkpoint = None
    # resumable state is kept only when asked for (--resume), in .<out>.fitstate/ beside --out
    ck_dir = g["checkpoint_dir"] or (dist_mod.default_checkpoint_dir(out) if out is not None and resume else None)
    if ck_dir is not None:
        key = {"source": [source_id["config_fingerprint"], source_id["weights_fingerprint"]],
               "target": [target_id["config_fingerprint"], target_id["weights_fingerprint"]],
               "token_ids_sha256": _token_sha(seqs), "calibration": config.__dict__, "params": params,
               "world": ctx.world if ctx else 1}
        checkpoint = dist_mod.Checkpoint(ck_dir, key, resume=resume, every_s=g["checkpoint_every"])
    elif resume:
        raise FitError("--resume needs a checkpoint folder", "pass --out (checkpoints live beside it)")
    cal = PairedCalibration(source_model, target_model, seqs, config, host=host, progress=progress,
                            checkpoint=checkpoint, dist=ctx)
    opts = dict(fitter_options)
    if memory_budget is not None:
        opts["memory_budget"] = memory_budget
    with torch.no_grad():
        mapping = fitter_obj.fit(cal.source_spec, cal.target_spec, calibration=cal, top_k=top_k, alpha=alpha, **opts)
    if not hasattr(mapping, "tensors"):  # the identity baseline: nothing to store
        if out is not None:
            raise FitError(f"the {fitter} fitter makes no artifact", "use it through kvbridge.transfer directly")
        return mapping
    calib = {**cal.describe(), "corpus_sha256": data_sha, "token_ids_sha256": _token_sha(seqs),
             "world_size": ctx.world if ctx else 1, "forward_seconds": round(cal.seconds, 3)}
    calib.update(_corpus_provenance(g["corpus_path"], texts, tokenizer, int(seqs.numel())))
    obs = (mapping.report or {}).get("observations") or {}
    feats = obs.get("features_per_head")
    if feats:
        ratio = calib["observations_train"] / feats
        calib["features_per_head"], calib["observations_per_feature"] = int(feats), round(ratio, 3)
        calib["min_observations_per_feature"] = MIN_OBS_PER_FEATURE
        if ratio < MIN_OBS_PER_FEATURE:
            mapping.report.setdefault("warnings", []).append(
                f"only {ratio:.1f} training observations per feature ({calib['observations_train']} per target head "
                f"for {feats} features; at least {MIN_OBS_PER_FEATURE} recommended): held-out R² will be low and "
                f"seed-dependent; calibrate on more --tokens, a smaller --stride or --top-k, or ridge-headwise")
    mapping.manifest = build_manifest(mapping, source=source_id, target=target_id, tokenizer=g["tokenizer_fingerprint"],
                                      calibration=calib)
    if out is not None:
        if ctx is None or ctx.is_main:
            from kvbridge.faults import fault_point

            fault_point("fit.save")
            save_mapping(mapping, out, force=force)
        dist_mod.barrier(ctx)  # every rank has finished with its checkpoint
        if checkpoint is not None and (ctx is None or ctx.is_main):
            checkpoint.clear()
    return mapping


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


__all__ = ["fit", "prepare_sequences"]
