"""bench/bench_fit_memory.py on the zoo: the fit's live peak follows the plan's fit memory, and --steps
says where it goes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_live_peak_is_the_planned_fit_memory_and_the_steps_are_listed():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        # 8,192 tokens = four batches of 4 x 512: from the second batch on, the statistics and their
        # workspace are held through a batch's forwards, the sum the plan's fit memory counts (a
        # one-batch fit allocates its statistics only after its forwards and peaks below the plan)
        [
            sys.executable,
            str(ROOT / "bench" / "bench_fit_memory.py"),
            *("--repeat", "1", "--warm", "--trim", "--steps", "--tokens", "8192"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    row = next(ln for ln in out.stdout.splitlines() if ln.startswith("| zoo:base -> zoo:stranger"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    stats, planned, peak = float(cells[3]), float(cells[4]), float(cells[5].split()[0])
    assert stats > 0 and planned > stats
    # live memory of a second fit: within 25% of the plan's statistics + workspace + calibration batch
    assert 0.75 * planned <= peak <= 1.25 * planned, row
    steps = out.stdout[out.stdout.index("steps of") :]
    for name in ("source forward", "target forward", "kept positions sampled", "statistics update", "solves"):
        assert name in steps, name
    peaks = [float(m) for m in re.findall(r"\| ([0-9.]+) \|$", steps, flags=re.M)]
    assert peaks and abs(max(peaks) - peak) < 0.2  # the steps' peak is the measured one
