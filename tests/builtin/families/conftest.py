"""Fixtures of the built-in family tests.

pytest runs with ``--import-mode=importlib`` (no test folder on ``sys.path``), so this folder is
put on the path for the test modules to import their shared helpers from ``family_oracle``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(scope="session")
def fixture_configs(shared_dir):
    """Real published config.json files: {folder name: mapping}."""
    root = shared_dir / "fixtures" / "configs"
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(root.glob("*/config.json"))}
