"""Errors that reach the user as one line: what went wrong and how to fix it.

Every error kvbridge raises on bad input is a :class:`KVBridgeError`. The CLI prints
``error: <message> (fix: <hint>)`` and exits non-zero, with no traceback.
"""

from __future__ import annotations


class KVBridgeError(Exception):
    """A user-facing error: ``what`` names the thing, ``fix`` says what to do."""

    exit_code = 2

    def __init__(self, what: str, fix: str | None = None):
        self.what = what
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = " ".join(str(self.what).split())
        if self.fix:
            text += f" (fix: {' '.join(str(self.fix).split())})"
        return text


class ConfigError(KVBridgeError):
    """A model config is missing, malformed or describes something kvbridge cannot handle."""


class UnsupportedModelError(KVBridgeError):
    """No family adapter claims this model type (or it has no KV cache at all)."""


class StateError(KVBridgeError):
    """A KV state does not fit the model it is used with (shape, dtype, non-finite values)."""


class PluginError(KVBridgeError):
    """A plugin registered something invalid (a duplicate name, a wrong type)."""


class ArtifactError(KVBridgeError):
    """An artifact on disk is corrupt, truncated, or was made for something else."""
