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


def test_heartbeat_prints_plain_stage_lines_while_a_step_runs_and_nothing_on_a_terminal():
    import io
    import time as _time

    from kvbridge.progress import Heartbeat

    buf = io.StringIO()  # not a terminal
    with Heartbeat("fit", stream=buf, every=0.02) as hb:
        hb.stage("loading the models")  # printed every 0.02 s while the step runs
        _time.sleep(0.2)
        hb.stage("calibrate forwards", 1000, "tokens")
        hb.advance(250)
        _time.sleep(0.1)
    lines = buf.getvalue().splitlines()
    loading = [ln for ln in lines if ln.startswith("fit: loading the models, ")]
    assert len(loading) >= 2 and all(" elapsed (" in ln for ln in lines)
    assert any("calibrate forwards 250/1,000 tokens (25%)" in ln for ln in lines)
    n = len(lines)
    _time.sleep(0.1)
    assert len(buf.getvalue().splitlines()) == n  # stopped with its block
    tty = io.StringIO()
    with Heartbeat("fit", stream=tty, tty=True, every=0.01) as hb:
        hb.stage("loading the models")
        _time.sleep(0.05)
    assert tty.getvalue() == ""
    quick = io.StringIO()
    with Heartbeat("fit", stream=quick, every=5) as hb:  # a command over within the first interval: silent
        hb.stage("reading the corpus")
    assert quick.getvalue() == ""
