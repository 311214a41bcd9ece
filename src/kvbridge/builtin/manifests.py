"""kvbridge's own model manifest records (``manifests/models`` at the repository top level, linked into the package as ``kvbridge/manifests`` and shipped as package data), published
through ``kvbridge_manifest_dirs`` like a plugin's folder; asked first so they win over plugins'."""

from __future__ import annotations

from kvbridge.check.sources import REPO_MANIFESTS
from kvbridge.hookspecs import hookimpl


@hookimpl(tryfirst=True)
def kvbridge_manifest_dirs():
    return [REPO_MANIFESTS] if REPO_MANIFESTS.is_dir() else []
