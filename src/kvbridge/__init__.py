"""kvbridge: move attention KV caches between transformer language models.

The top-level package imports nothing heavy: torch and transformers load only inside the
functions that need them, so config-only commands start fast.

    >>> import kvbridge
    >>> state = kvbridge.extract(model, ids)          # model's cache -> KVState
    >>> moved = kvbridge.identity_transfer(state)     # strip RoPE -> map -> re-apply
    >>> out = kvbridge.generate_from(model, moved, ids, max_new_tokens=20)
"""

from __future__ import annotations

from kvbridge.version import __version__  # noqa: E402

from kvbridge.errors import KVBridgeError  # noqa: E402  (no heavy deps)

# (``fit`` and ``transfer`` are subpackage/module names here: the functions live in
# ``kvbridge.api`` and ``kvbridge.fit``: ``from kvbridge.fit import fit, load_mapping, transfer``)
__all__ = [
    "__version__",
    "KVBridgeError",
    "resolve_model",
    "load_model",
    "load_pair",
    "adapter_for",
    "describe",
    "extract",  # noqa: F822
    "inject",
    "identity_transfer",
    "generate_from",
    "load_mapping",
    "transfer_state",
]
#: the names :func:`__getattr__` takes from :mod:`kvbridge.api` on first use
_API = frozenset(__all__[2:])


def __getattr__(name: str):
    if name in _API:
        from kvbridge import api

        return getattr(api, name)
    raise AttributeError(f"module 'kvbridge' has no attribute {name!r}")
