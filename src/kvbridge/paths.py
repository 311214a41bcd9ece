"""Where kvbridge keeps its own files: ``$KVBRIDGE_HOME`` (default ``~/.cache/kvbridge``).

- ``$KVBRIDGE_HOME/models/<name>/``: models kvbridge obtained itself (``kvbridge models fetch``),
- ``$KVBRIDGE_HOME/file-hashes.json``: the sha256 cache of weight files (by path, size, mtime),
- ``$KVBRIDGE_HOME/tokenizer-fingerprints.json``: the tokenizer-fingerprint cache.

Both caches are small JSON objects read and written by :func:`cache_read` / :func:`cache_write`
(best effort, atomic, newest entries kept); ``KVBRIDGE_NO_CACHE=1`` turns them off.

``$KVBRIDGE_CACHE_DIR`` (older name, used by the tokenizer-fingerprint cache) is honoured when
``$KVBRIDGE_HOME`` is not set; ``$XDG_CACHE_HOME`` moves the default. Nothing here is created
until something is written.
"""

from __future__ import annotations

import contextlib
import json
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


def cache_file(name: str) -> Path | None:
    """``$KVBRIDGE_HOME/<name>``, or None when ``KVBRIDGE_NO_CACHE`` is set."""
    return None if os.environ.get("KVBRIDGE_NO_CACHE") else kvbridge_home() / name


def cache_read(path: Path | None) -> dict:
    """The JSON object in a cache file; {} when there is none or it is unreadable."""
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cache_write(path: Path | None, key: str, value, limit: int) -> None:
    """Store ``key: value`` as the newest entry, keep the newest ``limit``, replace the file atomically.

    Best effort: a read-only home only means no cache (callers that share a file between threads
    hold their own lock around this).
    """
    if path is None:
        return
    with contextlib.suppress(OSError):
        data = cache_read(path)
        data.pop(key, None)
        data[key] = value
        if len(data) > limit:
            data = dict(list(data.items())[-limit:])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
