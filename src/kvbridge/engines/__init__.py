"""Inference engines: hand kvbridge's caches to a serving engine and read the engine's caches back.

An engine is a plugin kind (hook ``kvbridge_register_engines``, record
:class:`kvbridge.plugin_types.Engine`, protocol :class:`kvbridge.plugin_types.EngineProtocol`);
the built-in ``llamacpp`` engine (:mod:`kvbridge.engines.llamacpp`) registers through the same
hook as any third party's (:mod:`kvbridge.builtin.engines`). ``host.get("engine", name)`` loads one
by name (:meth:`kvbridge.plugins.Host.get`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


def kv_state_summary(state) -> dict:
    """The ``kv_state`` part of what ``kvbridge engine import`` reports about a state read from an engine."""
    return {
        "layers": state.num_layers,
        "kv_heads": state.spec.num_kv_heads,
        "tokens": state.num_tokens,
        "head_dim": state.spec.head_dim,
        "dtype": str(state.dtype).removeprefix("torch."),
        "positions": [int(state.positions.min()), int(state.positions.max())],
        "rope_applied": state.rope_applied,
        "model_type": state.spec.model_type,
        "bytes": state.nbytes(),
    }


@dataclass(frozen=True)
class ModuleEngine:
    """An engine object (:class:`kvbridge.plugin_types.EngineProtocol`) whose methods call the
    ``export_state`` / ``import_state`` / ``describe_file`` functions of the module ``module``."""

    name: str
    module: str

    def _call(self, fn: str, *args, **options):
        return getattr(importlib.import_module(self.module), fn)(*args, **options)

    def export_state(self, state, model, out=None, **options) -> bytes:
        return self._call("export_state", state, model, out, **options)

    def import_state(self, src, model, **options):
        return self._call("import_state", src, model, **options)

    def describe_file(self, src, model, **options) -> dict:
        return self._call("describe_file", src, model, **options)


__all__ = ["kv_state_summary", "ModuleEngine"]
