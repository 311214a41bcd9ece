"""The one public way to fit: :func:`fit` (``kvbridge.api.fit`` and ``kvbridge.fit.fit`` are this function).

References, loaded models or a pair are fitted with a :class:`~kvbridge.fit.settings.FitSettings`
through :func:`kvbridge.fit.run.fit_run`; model objects given in Python (:func:`fit_modules`) are
wrapped into a :class:`~kvbridge.run.Run` (:class:`~kvbridge.run.InMemoryModel`), their model-level
keywords resolved into a :class:`~kvbridge.fit.run.FitJob`, and the job run as every fit is
(:func:`kvbridge.fit.pipeline.execute`).
"""

from __future__ import annotations

from kvbridge.errors import ConfigError, did_you_mean
from kvbridge.fit.run import FitJob, fit_run, prepare, resolve_top_k, source_layers, validate_job
from kvbridge.fit.settings import FitSettings


def fit(source, target=None, data=None, settings=None, *, host=None, progress=None, warn=None, **fields):
    """``kvbridge fit`` as a call: fit a mapping from ``source``'s cache to ``target``'s (one way to fit:
    :func:`kvbridge.api.fit`, ``kvbridge.fit.fit`` and the command all come here).

    ``source`` / ``target``: references (loaded as a pair, the shared tokenizer checked first, in
    ``settings.dtype``), :class:`~kvbridge.models.loading.LoadedModel` s, a
    :class:`~kvbridge.models.pair.ModelPair` as ``source`` alone, or model objects (see below).
    ``settings``: a :class:`FitSettings` (its checks are the CLI's), or its fields as keywords
    (``seq_len=64, top_k=1, out="map/"``); ``data``: texts or token ids instead of ``settings.corpus``
    (text is tokenized with the pair's tokenizer). ``distributed=`` (keyword): a
    :mod:`kvbridge.fit.distributed` context (default: from the environment). Returns the
    :class:`~kvbridge.fit.mapping.FittedMapping`, or ``{label: mapping}`` for a top-k sweep.

    Model objects (``nn.Module`` s) take the model-level keywords of :func:`fit_modules` instead."""
    from os import PathLike

    from kvbridge.models import ModelRef
    from kvbridge.models.pair import ModelPair

    distributed = fields.pop("distributed", "auto")
    known = (str, PathLike, ModelRef, ModelPair)
    if not (isinstance(source, known) or hasattr(source, "fingerprint")):  # not a LoadedModel: model objects
        if settings is not None:
            raise ConfigError("fit of model objects takes keywords, not settings", "pass load_model() results")
        return fit_modules(source, target, data, fields, host=host, progress=progress, distributed=distributed)
    from kvbridge.run import Run

    settings = fit_settings(settings, **fields)
    prepared = prepare(settings, data=data, host=host)  # every refusal that needs no model, before loading one
    run = Run.of(pair_of(source, target, settings.dtype, host), settings, host)
    return fit_run(run, data=data, prepared=prepared, progress=progress, warn=warn, distributed=distributed)


def fit_settings(settings=None, **fields) -> FitSettings:
    """A :class:`FitSettings` from keywords (or ``settings`` with some replaced); an unknown name is
    refused naming the closest fields."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(FitSettings)]
    for key in fields:
        if key not in names:
            fix = did_you_mean(key, names).rstrip() or f"the settings are: {', '.join(names)}"
            raise ConfigError(f"fit has no setting {key!r}", fix)
    if settings is None:
        return FitSettings(**fields)
    return dataclasses.replace(settings, **fields) if fields else settings


def pair_of(source, target, dtype, host):
    """A :class:`~kvbridge.models.pair.ModelPair` from a pair, two references or two loaded models."""
    from os import PathLike

    from kvbridge.models import ModelRef, load
    from kvbridge.models.pair import ModelPair, load_pair, shared_tokenizer

    def is_ref(obj):
        return isinstance(obj, (str, PathLike, ModelRef))

    if isinstance(source, ModelPair):
        return source
    if is_ref(source) and is_ref(target):
        return load_pair(source, target, dtype=dtype, host=host)
    loaded = [load(obj, dtype=dtype, host=host) if is_ref(obj) else obj for obj in (source, target)]
    if not all(hasattr(obj, "model") and hasattr(obj, "fingerprint") for obj in loaded):
        raise ConfigError(
            "fit takes model references, loaded models (load_model), a pair (load_pair) or model objects",
            "pass two of one kind",
        )
    fingerprint, note = shared_tokenizer(loaded[0].ref, loaded[1].ref)
    return ModelPair(loaded[0], loaded[1], fingerprint, note)


#: the model-level keywords of :func:`fit_modules` (anything else names a calibration field, a
#: :class:`~kvbridge.fit.pipeline.Provenance` field or a fitter option)
MODULE_KEYWORDS = {
    "fitter": "ridge",
    "options": None,
    "calibration": None,
    "provenance": None,
    "tokenizer": None,
    "target_tokenizer": None,
    "tokenizer_fingerprint": None,
    "corpus_sha256": None,
    "corpus_path": None,
    "corpus_split": None,
    "out": None,
    "overwrite": False,
    "resume": False,
    "checkpoint_dir": None,
    "checkpoint_every": 60.0,
    "keep_stats": None,
}


def fit_modules(source_model, target_model, data, keywords: dict, *, host=None, progress=None, distributed="auto"):
    """The fit of two model objects (what ``kvbridge.fit.fit(source_model, target_model, data, ...)``
    takes): ``data`` token ids, texts or a corpus path with ``tokenizer=`` (``target_tokenizer=``: the
    two are checked to give the same ids); ``options=`` the fitter's options (a dataclass, a mapping
    or ``["key=value", ...]``); ``calibration=`` a :class:`~kvbridge.fit.calibrate.CalibrationConfig`;
    ``provenance=`` names and revisions; other keywords name a calibration field (``stride=2``), a
    provenance field or a fitter option (``top_k=[1, 2, "all"]`` sweeps). The models are wrapped
    into a :class:`~kvbridge.run.Run` and fitted as :func:`kvbridge.fit.run.fit_run` fits."""
    from kvbridge.fit.pipeline import execute, fitter_options, split_overrides
    from kvbridge.fit.solve import FitError
    from kvbridge.models.pair import ModelPair
    from kvbridge.plugins import get_host
    from kvbridge.run import InMemoryModel, Run

    if "force" in keywords:
        raise FitError("fit(force=...) was renamed", "pass overwrite=True (CHANGELOG.md)")
    host = host or get_host()
    kw = {k: keywords.get(k, default) for k, default in MODULE_KEYWORDS.items()}
    config, prov, overrides = split_overrides(
        {k: v for k, v in keywords.items() if k not in MODULE_KEYWORDS}, kw["calibration"], kw["provenance"]
    )
    fitter = host.get("fitter", kw["fitter"])
    raw = overrides.pop("top_k", None)
    sweepish = isinstance(raw, (list, tuple)) or (isinstance(raw, str) and (raw == "all" or "," in raw))
    if raw is not None and not sweepish:
        overrides["top_k"] = raw
    options = fitter_options(fitter, kw["options"], **overrides)
    if not all(hasattr(m, "parameters") for m in (source_model, target_model)):
        raise ConfigError(
            "fit takes model references, loaded models (load_model), a pair (load_pair) or model objects",
            "pass e.g. fit('zoo:base', 'zoo:wide', texts) or two nn.Module s",
        )
    run = Run(
        ModelPair(
            InMemoryModel.of(source_model, host, kw["tokenizer"], prov.source_name, prov.source_revision),
            InMemoryModel.of(target_model, host, kw["target_tokenizer"], prov.target_name, prov.target_revision),
            kw["tokenizer_fingerprint"],
        ),
        None,
        host,
    )
    layers = source_layers(run)
    options, sweep = resolve_top_k(
        fitter,
        options,
        raw if sweepish else None,
        given=raw is not None or _given(kw["options"]),
        layers=layers,
        name="the source model",
    )
    data, sha = _checked_texts(data, kw["tokenizer"], kw["target_tokenizer"])
    job = FitJob(
        fitter,
        options,
        sweep,
        config,
        data,
        corpus_sha256=kw["corpus_sha256"] or sha,
        overwrite=bool(kw["overwrite"]),
        fitter_name=kw["fitter"],
        **{k: kw[k] for k in ("corpus_path", "corpus_split", "out", "resume", "keep_stats", "checkpoint_dir")},
        checkpoint_every=kw["checkpoint_every"],
    )
    validate_job(run, job)
    return execute(run, job, progress=progress, distributed=distributed)


def _given(options) -> bool:
    """``top_k`` set in model-level ``options`` (a mapping, ``key=value`` pairs or a dataclass)."""
    if isinstance(options, dict):
        return "top_k" in options
    if isinstance(options, (list, tuple)):
        return any(str(o).split("=")[0].strip() == "top_k" for o in options)
    return options is not None


def _checked_texts(data, tokenizer, target_tokenizer):
    """``(data, corpus sha256 or None)``: text data checked to give the same ids with both tokenizers
    (a corpus path read first, its sha256 kept)."""
    from pathlib import Path

    if target_tokenizer is None or target_tokenizer is tokenizer:
        return data, None
    from kvbridge.corpus import load_corpus
    from kvbridge.fit.calibrate import check_same_tokens

    sha = None
    if isinstance(data, (str, Path)):
        data, sha = load_corpus(data)
    if isinstance(data, (list, tuple)) and all(isinstance(t, str) for t in data):
        check_same_tokens(list(data), tokenizer, target_tokenizer)  # paired calibration needs identical ids
    return data, sha


__all__ = ["MODULE_KEYWORDS", "fit", "fit_modules", "fit_settings", "pair_of"]
