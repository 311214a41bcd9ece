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


def test_pass_progress_draws_each_pass_and_sums_it_up(capsys):
    from kvbridge.progress import Heartbeat, pass_progress

    hb = Heartbeat("fit", stream=__import__("io").StringIO(), every=60)
    on = pass_progress(True, world=2, heartbeat=hb)
    on(("start", "train", 100))
    on(("advance", "train", 60))
    assert hb.name == "train forwards" and hb.done == 60 and hb.total == 100
    on(("advance", "train", 40))  # not a terminal: plain lines, the first and the last at least
    on(("end", "train", 0))
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("train: 60/100 tokens (60%)") and "tok/s" in err[0]
    assert err[-2].startswith("train: 100/100 tokens (100%)")
    assert err[-1].startswith("train: 100 tokens through both models in ") and "(rank 0 of 2;" in err[-1]
    assert hb.name == "solving and writing the mapping"
    quiet = pass_progress(False)
    quiet(("start", "held", 10))
    quiet(("end", "held", 0))
    assert capsys.readouterr().err == ""
