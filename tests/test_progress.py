"""kvbridge.progress.json_ready: the one JSON-ready conversion of results and partial logs."""

import math
from pathlib import Path

import torch

from kvbridge.progress import json_ready


def test_json_ready_converts_tensors_tuples_and_non_finite_numbers():
    got = json_ready({1: (torch.tensor([1.0, math.nan]), float("inf")), "n": None, "ok": True})
    assert got == {"1": [[1.0, None], None], "n": None, "ok": True}
    assert json_ready(Path("/x")) == "/x"  # other objects become text
    assert json_ready([Path("/x")], stringify=False) == [Path("/x")]  # or stay as they are
