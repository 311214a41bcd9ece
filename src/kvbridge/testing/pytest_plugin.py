"""pytest fixtures shipped with kvbridge (registered through the ``pytest11`` entry point)."""

from __future__ import annotations

import pytest

from kvbridge.plugins import make_host


@pytest.fixture
def kvbridge_host():
    """An isolated plugin host with the built-ins and installed entry points."""
    return make_host()


@pytest.fixture
def kvbridge_builtin_host():
    """An isolated host with the built-in plugins only (no third-party entry points)."""
    return make_host(entry_points=False)
