"""Run from a checkout too: without `pip install -e plugins/kvbridge-vllm`, import from src/
(the entry-point test then skips, since kvbridge cannot discover an uninstalled plugin)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("kvbridge_vllm") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
