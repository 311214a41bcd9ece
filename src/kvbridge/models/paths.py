"""Where kvbridge keeps its own files: ``$KVBRIDGE_HOME`` (default ``~/.cache/kvbridge``).

- ``$KVBRIDGE_HOME/models/<name>/``: models kvbridge obtained itself (``kvbridge models fetch``),
- ``$KVBRIDGE_HOME/file-hashes.json``: the sha256 cache of weight files (by path, size, mtime).

``$KVBRIDGE_CACHE_DIR`` (older name, used by the tokenizer-fingerprint cache) is honoured when
``$KVBRIDGE_HOME`` is not set; ``$XDG_CACHE_HOME`` moves the default. Nothing here is created
until something is written.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "KVBRIDGE_HOME"


def kvbridge_home() -> Path:
    """``$KVBRIDGE_HOME``, else ``$KVBRIDGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvbridge`` or ``~/.cache/kvbridge``."""
    for var in (HOME_ENV, "KVBRIDGE_CACHE_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvbridge"


def models_home() -> Path:
    """The folder of models kvbridge fetched (``$KVBRIDGE_HOME/models``)."""
    return kvbridge_home() / "models"
