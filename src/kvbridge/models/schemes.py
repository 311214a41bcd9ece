"""Reference schemes: ``NAME:REST`` prefixes that turn a reference into a path or a ModelRef.

Every scheme, the built-in ``zoo:NAME`` included (:mod:`kvbridge.builtin.model_sources`), is
registered through the ``kvbridge_register_model_sources(register)`` hook: ``register("myhub",
resolver, "one-line description")`` where ``resolver(rest: str)`` returns a local path (a folder,
a ``config.json`` or a ``.gguf``; resolved like any path) or a :class:`~kvbridge.models.ModelRef`.
A resolver must not download anything and should stay cheap (it runs for ``describe``). The host
collects them (:meth:`kvbridge.plugins.Host.model_sources`); this module only looks them up.
"""

from __future__ import annotations

from kvbridge.plugin_types import SCHEME_RE, ModelSource
from kvbridge.plugins import host_or_default


def schemes(host=None) -> dict[str, ModelSource]:
    """Every registered scheme by name: built-ins first, then plugins (in the host's order)."""
    return host_or_default(host).model_sources()


def split_scheme(ref: str, known: dict[str, ModelSource]) -> tuple[ModelSource, str] | None:
    """``(scheme, rest)`` when ``ref`` starts with a registered ``NAME:``, else None."""
    name, sep, rest = ref.partition(":")
    return (known[name], rest) if sep and name in known else None


__all__ = ["ModelSource", "schemes", "split_scheme", "SCHEME_RE"]
