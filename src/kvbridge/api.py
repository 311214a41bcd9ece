"""The Python API in one place (the CLI is a thin layer over these).

A name whose work is one library function is that function, imported on first use (:data:`_SAME`):
one definition, one signature, one docstring."""

from __future__ import annotations

from typing import Any, Mapping

from kvbridge.models import resolve
from kvbridge.models.pair import is_ref
from kvbridge.plugin_types import load_object
from kvbridge.plugins import host_or_default
from kvbridge.steer.settings import SteerBuildSettings, SteerEvalSettings, SteerRunSettings, SteerTransferSettings
from kvbridge.spec import ModelSpec


def _config_of(obj: Any, host=None) -> dict:
    if is_ref(obj):
        return dict(resolve(obj, host=host).config)
    if isinstance(obj, Mapping):
        return dict(obj)
    return getattr(obj, "config", obj).to_dict()


def adapter_for(model_or_config: Any, host=None):
    """The family adapter of a model, a model reference, a transformers config or a config mapping."""
    return host_or_default(host).adapter_for(_config_of(model_or_config, host))


def describe(model_or_config: Any, host=None) -> ModelSpec:
    """ModelSpec of a model (dtype from its weights), a model reference (read from its config or
    GGUF header, never loaded), a transformers config or a mapping."""
    if is_ref(model_or_config):
        return resolve(model_or_config, host=host).spec(host_or_default(host))
    if hasattr(model_or_config, "parameters"):
        return host_or_default(host).spec_of(model_or_config)
    return host_or_default(host).describe(_config_of(model_or_config))


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


def _loaded(model, host=None):
    """A :class:`~kvbridge.models.loading.LoadedModel`: references are loaded (float32, cpu)."""
    from kvbridge.models import load

    return load(model, host=host) if is_ref(model) else model


def _stage(name: str, target, settings, host, **kw):
    """A ``steer`` stage of :mod:`kvbridge.steer.stages` on a run of ``settings``."""
    from kvbridge.run import Run
    from kvbridge.steer import stages

    return getattr(stages, name)(Run.of(target, settings, host), **kw)


def steer_build(model, settings: SteerBuildSettings, host=None):
    """``kvbridge steer build`` as a call: ``model`` a reference or a :func:`load_model` result (its
    ``tokenizer`` the one to use); returns ``(vector folder, manifest)``."""
    return _stage("build_steering", _loaded(model, host), settings, host)


def steer_transfer(pair, settings: SteerTransferSettings, host=None):
    """``kvbridge steer transfer`` as a call: ``pair`` a :func:`load_pair` result (the vector's model
    first); returns ``(vector folder, mapping)``."""
    return _stage("transfer_steering", pair, settings, host)


def steer_run(model, settings: SteerRunSettings, host=None) -> dict:
    """``kvbridge steer run`` as a call: the steered and unsteered continuations (JSON-ready)."""
    return _stage("run_steering", _loaded(model, host), settings, host)


def steer_eval(model, settings: SteerEvalSettings, host=None, log=None) -> dict:
    """``kvbridge steer eval`` as a call: every arm's behaviour rate and cost (JSON-ready; the report
    folder written with ``settings.out``)."""
    return _stage("evaluate_steering", _loaded(model, host), settings, host, log=log)


#: the API names that are one library function each: ``name -> "module:function"``
_SAME = {
    "resolve_model": "kvbridge.models.resolve:resolve",  # offline, torch-free
    "load_model": "kvbridge.models.loading:load",  # the one loader (float32 unless dtype= says otherwise)
    "load_pair": "kvbridge.models.pair:load_pair",  # the shared tokenizer checked before any weights load
    "generate_from": "kvbridge.handoff:generate",  # the last prompt token is withheld
    "fit": "kvbridge.fit.entry:fit",  # references, loaded models, a pair or model objects
    "fit_settings": "kvbridge.fit.entry:fit_settings",
    "fit_pair": "kvbridge.fit.run:fit_pair",  # deprecated: fit(pair, settings=settings)
    "load_mapping": "kvbridge.fit.artifact:load_mapping",
    "transfer_state": "kvbridge.fit:transfer_state",  # strip source RoPE, map, apply target RoPE  # checksum and model fingerprints verified
    "transfer_generate": "kvbridge.transfer_run:transfer_generate",  # ``kvbridge transfer`` as a call
    "evaluate_pair": "kvbridge.recompute.eval_run:evaluate_pair",  # ``kvbridge eval`` as a call
    "harness_pair": "kvbridge.harness.pair_run:harness_pair",  # ``kvbridge harness`` as a call
}


def __getattr__(name: str):
    if name in _SAME:
        return load_object(_SAME[name])
    raise AttributeError(f"module 'kvbridge.api' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SAME))
