"""The Python API in one place (the CLI is a thin layer over these)."""

from __future__ import annotations

from os import PathLike
from typing import Any, Mapping

from kvbridge.models.loading import load as load_model  # the one loader (float32 unless ``dtype`` says otherwise)
from kvbridge.models.pair import load_pair  # noqa: F401 - public (the shared tokenizer checked before weights load)
from kvbridge.steer.settings import SteerBuildSettings, SteerEvalSettings, SteerRunSettings, SteerTransferSettings
from kvbridge.spec import ModelSpec


def _host(host=None):
    from kvbridge.plugins import get_host

    return host or get_host()


def _is_ref(obj: Any) -> bool:
    from kvbridge.models import ModelRef

    return isinstance(obj, (str, PathLike, ModelRef))


def _config_of(obj: Any, host=None) -> dict:
    if _is_ref(obj):
        return dict(resolve_model(obj, host=host).config)
    if isinstance(obj, Mapping):
        return dict(obj)
    config = getattr(obj, "config", obj)
    return config.to_dict()


def resolve_model(ref, host=None):
    """A model reference resolved offline, torch-free (see :func:`kvbridge.models.resolve`)."""
    from kvbridge.models import resolve

    return resolve(ref, host=host)


def adapter_for(model_or_config: Any, host=None):
    """The family adapter of a model, a model reference, a transformers config or a config mapping."""
    return _host(host).adapter_for(_config_of(model_or_config, host))


def describe(model_or_config: Any, host=None) -> ModelSpec:
    """ModelSpec of a model (dtype from its weights), a model reference (read from its config or
    GGUF header, never loaded), a transformers config or a mapping."""
    if _is_ref(model_or_config):
        return resolve_model(model_or_config, host=host).spec(_host(host))
    if hasattr(model_or_config, "parameters"):
        return _host(host).spec_of(model_or_config)
    return _host(host).describe(_config_of(model_or_config))


def extract(model, input_ids, attention_mask=None, host=None):
    """Prefill ``input_ids`` and return the model's cache as a :class:`~kvbridge.kvstate.KVState`."""
    return adapter_for(model, host).extract(model, input_ids, attention_mask)


def inject(state, model, host=None):
    """A fresh ``DynamicCache`` for ``model`` holding ``state`` (validated, cloned)."""
    return adapter_for(model, host).inject(state, model)


def identity_transfer(state, target_positions=None, host=None):
    """Same-model transfer through strip RoPE -> identity map -> re-apply (exact baseline)."""
    from kvbridge.transfer import identity_transfer as _identity

    return _identity(state, target_positions=target_positions, host=host)


def generate_from(model, state, input_ids, host=None, **generate_kwargs):
    """``model.generate`` continuing from ``state`` (the last prompt token is withheld)."""
    from kvbridge.handoff import generate

    return generate(model, state, input_ids, host=host, **generate_kwargs)


def fit(source, target=None, data=None, settings=None, *, host=None, progress=None, warn=None, **fields):
    """``kvbridge fit`` as a call (:func:`kvbridge.fit.entry.fit`): ``source`` / ``target`` references,
    :func:`load_model` results, a :func:`load_pair` result as ``source`` alone, or model objects;
    ``settings`` a :class:`~kvbridge.fit.settings.FitSettings` or its fields as keywords; ``data``
    texts or token ids instead of ``settings.corpus``. Returns the mapping, or ``{label: mapping}``
    for a top-k sweep."""
    from kvbridge.fit.entry import fit as _fit

    return _fit(source, target, data, settings, host=host, progress=progress, warn=warn, **fields)


def fit_settings(settings=None, **fields):
    """A :class:`~kvbridge.fit.settings.FitSettings` from keywords (or ``settings`` with some replaced);
    an unknown name is refused naming the closest fields."""
    from kvbridge.fit.entry import fit_settings as _settings

    return _settings(settings, **fields)


def fit_pair(pair, settings, **kwargs):
    """Deprecated: ``fit(pair, settings=settings)`` (see :func:`kvbridge.fit.run.fit_pair`)."""
    from kvbridge.fit.run import fit_pair as _run

    return _run(pair, settings, **kwargs)


def load_mapping(path, **options):
    """Load a mapping folder (checksum and model fingerprints verified)."""
    from kvbridge.fit.artifact import load_mapping as _load

    return _load(path, **options)


def transfer_state(state, mapping, target_positions=None, host=None):
    """Source KVState -> target KVState: strip source RoPE, map, apply target RoPE."""
    from kvbridge.transfer import transfer as _transfer

    return _transfer(state, mapping, target_positions=target_positions, host=host)


def transfer_generate(pair, settings, host=None):
    """``kvbridge transfer`` as a call: ``pair`` a :func:`load_pair` result, ``settings`` a
    :class:`~kvbridge.transfer_settings.TransferSettings` (its checks are the CLI's); returns a
    :class:`~kvbridge.transfer_run.TransferResult` (see :func:`kvbridge.transfer_run.transfer_generate`)."""
    from kvbridge.transfer_run import transfer_generate as _run

    return _run(pair, settings, host=host)


def evaluate_pair(pair, settings, **callbacks):
    """``kvbridge eval`` as a call: ``pair`` a :func:`load_pair` result, ``settings`` an
    :class:`~kvbridge.evaluate.settings.EvalSettings` (its checks are the CLI's); returns an
    :class:`~kvbridge.evaluate.run.EvalRun` (``progress=``, ``heartbeat=``, ``warn=`` callbacks optional;
    ``--frontier`` / ``--recompute-*`` settings run :mod:`kvbridge.recompute.eval_run`'s condition sets)."""
    from kvbridge.recompute.eval_run import evaluate_pair as _run

    return _run(pair, settings, **callbacks)


def harness_pair(pair, settings, **kwargs):
    """``kvbridge harness`` as a call: ``pair`` a :func:`load_pair` result, ``settings`` a
    :class:`~kvbridge.harness.settings.HarnessSettings` (its checks are the CLI's, plus
    :func:`kvbridge.harness.pair_run.prepare`'s); returns ``(result, written report files)``."""
    from kvbridge.harness.pair_run import harness_pair as _run

    return _run(pair, settings, **kwargs)


def _loaded(model, host=None):
    """A :class:`~kvbridge.models.loading.LoadedModel`: references are loaded (float32, cpu)."""
    return load_model(model, host=host) if _is_ref(model) else model


def steer_build(model, settings: SteerBuildSettings, host=None):
    """``kvbridge steer build`` as a call: ``model`` a reference or a :func:`load_model` result (its
    ``tokenizer`` the one to use); returns ``(vector folder, manifest)``."""
    from kvbridge.run import Run
    from kvbridge.steer.stages import build_steering

    return build_steering(Run.of(_loaded(model, host), settings, host))


def steer_transfer(pair, settings: SteerTransferSettings, host=None):
    """``kvbridge steer transfer`` as a call: ``pair`` a :func:`load_pair` result (the vector's model
    first); returns ``(vector folder, mapping)``."""
    from kvbridge.run import Run
    from kvbridge.steer.stages import transfer_steering

    return transfer_steering(Run.of(pair, settings, host))


def steer_run(model, settings: SteerRunSettings, host=None) -> dict:
    """``kvbridge steer run`` as a call: the steered and unsteered continuations (JSON-ready)."""
    from kvbridge.run import Run
    from kvbridge.steer.stages import run_steering

    return run_steering(Run.of(_loaded(model, host), settings, host))


def steer_eval(model, settings: SteerEvalSettings, host=None, log=None) -> dict:
    """``kvbridge steer eval`` as a call: every arm's behaviour rate and cost (JSON-ready; the report
    folder written with ``settings.out``)."""
    from kvbridge.run import Run
    from kvbridge.steer.stages import evaluate_steering

    return evaluate_steering(Run.of(_loaded(model, host), settings, host), log=log)
