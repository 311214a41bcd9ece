"""Inference engines: hand kvbridge's caches to a serving engine and read the engine's caches back.

An engine is a plugin kind (hook ``kvbridge_register_engines``, record
:class:`kvbridge.plugin_types.Engine`, protocol :class:`kvbridge.plugin_types.EngineProtocol`);
the built-in ``llamacpp`` engine (:mod:`kvbridge.engines.llamacpp`) registers through the same
hook as any third party's (:mod:`kvbridge.builtin.engines`). :func:`get_engine` loads one by
name through the plugin host.
"""

from __future__ import annotations

from typing import Any


def get_engine(name: str, host=None) -> Any:
    """The engine object registered as ``name`` (its factory loaded and checked); a one-line
    :class:`~kvbridge.errors.PluginError` for an unknown name or a broken plugin."""
    if host is None:
        from kvbridge.plugins import get_host

        host = get_host()
    from kvbridge.plugin_types import loaded

    record = host.engine(name)
    return loaded("engine", name, record.load(), host.owner("engine", name))


def engine_names(host=None) -> list[str]:
    if host is None:
        from kvbridge.plugins import get_host

        host = get_host()
    return host.registry("engine").names()


__all__ = ["get_engine", "engine_names"]
