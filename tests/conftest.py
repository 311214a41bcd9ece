"""Shared fixtures. Tests that need ../shared read it through `shared_dir` and skip without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Tiny models run fastest single-threaded (and a shared 2-core box stays responsive)."""
    import torch

    torch.set_num_threads(1)


def _shared() -> Path:
    env = os.environ.get("KVBRIDGE_SHARED")
    return Path(env) if env else REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder (real configs, tokenizers, corpus); skip when absent."""
    path = _shared()
    if not (path / "fixtures").is_dir():
        pytest.skip(f"shared fixtures not found at {path}")
    return path


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
