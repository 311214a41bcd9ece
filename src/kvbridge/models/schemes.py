"""Reference schemes: ``NAME:REST`` prefixes that turn a reference into a path or a ModelRef.

Built in: ``zoo:NAME`` (a model of the embedded tiny zoo). Plugins add schemes through the
``kvbridge_register_model_sources(register)`` hook: ``register("myhub", resolver,
"one-line description")`` where ``resolver(rest: str)`` returns a local path (a folder, a
``config.json`` or a ``.gguf``; resolved like any path) or a :class:`~kvbridge.models.ModelRef`.
A resolver must not download anything and should stay cheap (it runs for ``describe``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from kvbridge.errors import ConfigError, PluginError

SCHEME_RE = re.compile(r"^[a-z][a-z0-9_.+-]*$")
HOOK = "kvbridge_register_model_sources"


@dataclass(frozen=True)
class Scheme:
    name: str
    resolver: Callable[[str], Any]
    description: str = ""
    plugin: str = "kvbridge"


def _zoo(rest: str):
    from kvbridge.zoo import ZOO_NAMES, model_dir

    if not rest:
        raise ConfigError("zoo: needs a model name", f"use one of: {', '.join('zoo:' + n for n in ZOO_NAMES)}")
    return model_dir(rest)


BUILTIN = (Scheme("zoo", _zoo, "a model of kvbridge's embedded tiny zoo (zoo:base, zoo:wide, ...)"),)


def schemes(host=None) -> dict[str, Scheme]:
    """Every registered scheme by name: built-ins first, then plugins (in the host's order)."""
    out = {s.name: s for s in BUILTIN}
    if host is None:
        from kvbridge.plugins import get_host

        host = get_host()
    caller = getattr(getattr(host, "pm", None), "hook", None)
    if caller is None or getattr(caller, HOOK, None) is None or not hasattr(host, "call"):
        return out
    from kvbridge.plugins import current_plugin

    def register(name: str, resolver: Callable[[str], Any], description: str = "") -> None:
        _plugin = current_plugin() or "?"
        if not isinstance(name, str) or not SCHEME_RE.match(name):
            raise PluginError(f"plugin {_plugin!r} registered model source {name!r}",
                              "a scheme is a lowercase name such as 'myhub' (used as myhub:REST)")
        if not callable(resolver):
            raise PluginError(f"plugin {_plugin!r}: model source {name!r} has no callable resolver",
                              "call register(name, resolver, description)")
        if name in out:
            raise PluginError(f"plugin {_plugin!r} registered model source {name!r}, which "
                              f"{out[name].plugin!r} already provides", "choose another scheme name")
        out[name] = Scheme(name, resolver, description, _plugin)

    host.call(HOOK, register=register)  # pluggy's order; a failing plugin is recorded on it by the host
    return out


def split_scheme(ref: str, known: dict[str, Scheme]) -> tuple[Scheme, str] | None:
    """``(scheme, rest)`` when ``ref`` starts with a registered ``NAME:``, else None."""
    name, sep, rest = ref.partition(":")
    if sep and name in known:
        return known[name], rest
    return None


__all__ = ["Scheme", "schemes", "split_scheme", "BUILTIN", "HOOK"]
