"""Inference engines: hand kvbridge's caches to a serving engine and read the engine's caches back.

An engine is a plugin kind (hook ``kvbridge_register_engines``, record
:class:`kvbridge.plugin_types.Engine`, protocol :class:`kvbridge.plugin_types.EngineProtocol`);
the built-in ``llamacpp`` engine (:mod:`kvbridge.engines.llamacpp`) registers through the same
hook as any third party's (:mod:`kvbridge.builtin.engines`). ``host.get("engine", name)`` loads one
by name (:meth:`kvbridge.plugins.Host.get`).
"""

from __future__ import annotations

from typing import Any


def get_engine(name: str, host=None) -> Any:
    """Deprecated: ``host.get("engine", name)`` (:meth:`kvbridge.plugins.Host.get`)."""
    from kvbridge.plugins import host_or_default

    return host_or_default(host).get("engine", name)


__all__ = ["get_engine"]
