"""Fitting K/V mappings between two models (``kvbridge fit``), and using them.

The Python API mirrors the CLI::

    from kvbridge.fit import fit, load_mapping, transfer_state
    mapping = fit(source_model, target_model, token_ids_or_corpus, top_k=4, out="map/")
    mapping = load_mapping("map/", source=source_model, target=target_model)
    target_state = transfer_state(source_state, mapping)          # KVState for the target
    kvbridge.generate_from(target_model, target_state, ids, ...)  # last prompt token withheld

Modules: :mod:`~kvbridge.fit.stats` (streaming float64 statistics, distributed reduction),
:mod:`~kvbridge.fit.ridge` (the solver and the ``ridge`` fitter, memory model),
:mod:`~kvbridge.fit.select` (top-k source layers), :mod:`~kvbridge.fit.headwise`
(``ridge-headwise``), :mod:`~kvbridge.fit.sklearn_fitter` (``sklearn``),
:mod:`~kvbridge.fit.calibrate` (paired calibration, sampling), :mod:`~kvbridge.fit.mapping`
(the batched mapping), :mod:`~kvbridge.fit.artifact` (mapping folders),
:mod:`~kvbridge.fit.plan` (resource plan from configs alone; ``kvbridge.fit.plan(src, tgt)``),
:mod:`~kvbridge.fit.distributed` (torch.distributed, checkpoints / resume),
:mod:`~kvbridge.fit.pipeline` (a resolved fit run on the models),
:mod:`~kvbridge.fit.settings` (``FitSettings``: every ``kvbridge fit`` option),
:mod:`~kvbridge.fit.entry` (``fit``: the one way to fit, references, loaded models, a pair or model
objects) and :mod:`~kvbridge.fit.run` (``fit_run(run)``: the command's call on a :class:`~kvbridge.run.Run`).

Importing this package imports nothing heavy; the names below load on first use.
"""

from __future__ import annotations

_LAZY = {
    "fit": "kvbridge.fit.entry:fit",
    "fit_run": "kvbridge.fit.run:fit_run",
    "fit_pair": "kvbridge.fit.run:fit_pair",
    "FitSettings": "kvbridge.fit.settings:FitSettings",
    "load_mapping": "kvbridge.fit.artifact:load_mapping",
    "save_mapping": "kvbridge.fit.artifact:save_mapping",
    "FittedMapping": "kvbridge.fit.mapping:FittedMapping",
    "MomentStats": "kvbridge.fit.stats:MomentStats",
    "plan": "kvbridge.fit.plan",  # the module is callable: kvbridge.fit.plan(source, target, ...) plans a fit
}


def transfer_state(state, mapping, target_positions=None, host=None):
    """Source KVState -> target KVState through ``mapping`` (strip RoPE, map, apply target RoPE)."""
    from kvbridge.transfer import transfer

    return transfer(state, mapping, target_positions=target_positions, host=host)


def __getattr__(name):
    if name == "transfer":
        return transfer_state
    if name in _LAZY:
        from kvbridge.plugin_types import load_object

        return load_object(_LAZY[name])
    raise AttributeError(f"module 'kvbridge.fit' has no attribute {name!r}")


__all__ = list(_LAZY) + ["transfer_state"]
