"""The one public way to fit: :func:`fit` (``kvbridge.api.fit`` and ``kvbridge.fit.fit`` are this function).

References, loaded models, a pair or model objects given in Python are made into one
:class:`~kvbridge.run.Run` of a :class:`~kvbridge.fit.settings.FitSettings` and fitted by
:func:`kvbridge.fit.run.fit_run` (model objects: :func:`kvbridge.run.model_run`).
"""

from __future__ import annotations

import dataclasses
import warnings

from kvbridge.errors import ConfigError, did_you_mean
from kvbridge.fit.run import fit_run, prepare, same_named
from kvbridge.fit.settings import FitSettings

SETTINGS = tuple(f.name for f in dataclasses.fields(FitSettings))
#: keywords of :func:`fit` that are no :class:`FitSettings` field: passed on to :func:`fit_run`
RUN_KEYWORDS = ("distributed", "checkpoint_every")


def fit(source, target=None, data=None, settings=None, *, host=None, progress=None, warn=None, **fields):
    """``kvbridge fit`` as a call: fit a mapping from ``source``'s cache to ``target``'s (one way to fit:
    :func:`kvbridge.api.fit`, ``kvbridge.fit.fit`` and the command all come here).

    ``source`` / ``target``: references (loaded as a pair, the shared tokenizer checked first, in
    ``settings.dtype``), :class:`~kvbridge.models.loading.LoadedModel` s, a
    :class:`~kvbridge.models.pair.ModelPair` as ``source`` alone, or two model objects (``nn.Module``
    s; ``tokenizer=`` for text ``data``). ``settings``: a :class:`FitSettings` (its checks are the
    CLI's), or its fields as keywords (``seq_len=64, top_k=1, out="map/"``); a keyword naming an
    option of the fitter (``memory_budget=``, ``support=``) is that option, ``options=`` the fitter's
    options as a dataclass, a mapping or ``["key=value", ...]`` (the settings' shortcuts win), and
    ``calibration=`` a :class:`~kvbridge.fit.calibrate.CalibrationConfig` gives its fields.
    ``data``: texts, token ids or a corpus path instead of ``settings.corpus``. ``distributed=``: a
    :mod:`kvbridge.fit.distributed` context (default: from the environment). Returns the
    :class:`~kvbridge.fit.mapping.FittedMapping`, or ``{label: mapping}`` for a top-k sweep."""
    from kvbridge.fit.pipeline import option_base
    from kvbridge.fit.protocol import option_fields
    from kvbridge.plugins import host_or_default
    from kvbridge.run import Run, model_run

    if "force" in fields:
        raise ConfigError("fit(force=...) was renamed", "pass overwrite=True (CHANGELOG.md)")
    host = host_or_default(host)
    extra = {k: fields.pop(k) for k in RUN_KEYWORDS if k in fields}
    options, tokenizer, calibration = (fields.pop(k, None) for k in ("options", "tokenizer", "calibration"))
    if calibration is not None:  # a CalibrationConfig's fields are settings (its offset: --tokens-offset)
        given = {"tokens_offset": calibration.offset, **same_named(FitSettings, calibration)}
        fields = {**{k: v for k, v in given.items() if v is not None}, **fields}
    if "offset" in fields:
        fields["tokens_offset"] = fields.pop("offset")
    names, revisions = _legacy_names(fields)
    fitter = host.get("fitter", fields.get("fitter") or getattr(settings, "fitter", "ridge"))
    by_name = {k: fields.pop(k) for k in list(fields) if k not in SETTINGS and k in option_fields(fitter.Options)}
    settings = fit_settings(settings, **fields)
    base = {**option_base(options), **by_name}
    prepared = prepare(settings, data=data, host=host, options=base)  # every refusal before a model loads
    if all(hasattr(m, "parameters") and not hasattr(m, "fingerprint") for m in (source, target)):  # model objects
        run = model_run(source, target, settings, host, tokenizer=tokenizer, names=names, revisions=revisions)
    else:
        if tokenizer is not None:
            raise ConfigError(
                "fit(tokenizer=) is for model objects", "references and loaded models bring their own tokenizer"
            )
        run = Run.of(pair_of(source, target, settings.dtype, host), settings, host)
    return fit_run(run, data=data, prepared=prepared, progress=progress, warn=warn, **extra)


def fit_settings(settings=None, **fields) -> FitSettings:
    """A :class:`FitSettings` from keywords (or ``settings`` with some replaced); an unknown name is
    refused naming the closest fields."""
    for key in fields:
        if key not in SETTINGS:
            fix = did_you_mean(key, SETTINGS).rstrip() or f"the settings are: {', '.join(SETTINGS)}"
            raise ConfigError(f"fit has no setting {key!r}", fix)
    if settings is None:
        return FitSettings(**fields)
    return dataclasses.replace(settings, **fields) if fields else settings


def _legacy_names(fields: dict) -> tuple:
    """The manifest ``(names, revisions)`` of model objects from the deprecated ``provenance=`` /
    ``source_name=`` / ``target_name=`` / ``*_revision=`` keywords (removed from ``fields``), with a
    deprecation warning."""
    keys = ("provenance", "source_name", "target_name", "source_revision", "target_revision")
    given = {k: fields.pop(k) for k in keys if k in fields}
    if not given:
        return ("", ""), (None, None)
    warnings.warn(
        "fit(provenance=, source_name=, target_name=, source_revision=, target_revision=) is deprecated: name "
        "model objects with kvbridge.run.model_run(source, target, settings, names=(SOURCE, TARGET), "
        "revisions=(REV, REV)) and fit_run(run, data=...)",
        DeprecationWarning,
        stacklevel=3,
    )
    prov = given.get("provenance")
    names = tuple(given.get(f"{r}_name") or getattr(prov, f"{r}_name", "") for r in ("source", "target"))
    return names, tuple(
        given.get(f"{r}_revision") or getattr(prov, f"{r}_revision", None) for r in ("source", "target")
    )


def pair_of(source, target, dtype, host):
    """A :class:`~kvbridge.models.pair.ModelPair` from a pair, references or loaded models."""
    from kvbridge.models.pair import ModelPair, is_ref, load_pair

    if isinstance(source, ModelPair):
        return source
    if not all(is_ref(obj) or (hasattr(obj, "model") and hasattr(obj, "fingerprint")) for obj in (source, target)):
        raise ConfigError(
            "fit takes model references, loaded models (load_model), a pair (load_pair) or model objects",
            "pass two of one kind, e.g. fit('zoo:base', 'zoo:wide', texts) or two nn.Module s",
        )
    return load_pair(source, target, dtype=dtype, host=host)
