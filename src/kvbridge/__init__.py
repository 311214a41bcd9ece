"""kvbridge: move attention KV caches between transformer language models.

The top-level package imports nothing heavy: torch and transformers load only inside the
functions that need them, so config-only commands start fast.
"""

from __future__ import annotations

__version__ = "0.1.0"

from kvbridge.errors import KVBridgeError  # noqa: E402  (no heavy deps)

__all__ = ["__version__", "KVBridgeError"]
