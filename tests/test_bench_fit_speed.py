"""bench/bench_fit_speed.py at a tiny size: every candidate fits, and its weights, mapped K/V and
selection scores stay within float32-Gram error of the library's float64 path (``f64``:
``-o gram_dtype=float64``)."""

import json
import math
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_bench_fit_speed_tiny(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import bench_fit_speed
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "r.json"
    cands = "f64,base,f32gram,f32sym,trainr2,batched,f32sym+trainr2"
    args = ["--obs", "600", "--geometry", "4x2x16-5x2x32", "--threads", "1", "--repeats", "1"]
    assert (
        bench_fit_speed.main(
            [*args, "--candidates", cands, "--reference", "f64", "--spread", "2", "--offset", "3", "--json", str(out)]
        )
        == 0
    )
    fit = json.loads(out.read_text())["threads"]["1"]["fit"]
    assert sorted(fit) == sorted(cands.split(","))
    for name, row in fit.items():
        acc = row["accuracy"]
        assert row["median_s"] > 0
        assert acc["same_selection"], name
        for key in ("w", "b", "mapped_k", "mapped_v", "scores_abs"):
            assert math.isfinite(acc[key]) and acc[key] < 1e-4, (name, key, acc[key])
    assert all(fit["f64"]["accuracy"][k] == 0.0 for k in ("w", "b", "mapped_k", "mapped_v"))
    # the library's default float32 Gram and the prototype's patch really change the arithmetic, within the bound above
    assert fit["base"]["accuracy"]["w"] > 0.0 and fit["f32sym"]["accuracy"]["w"] > 0.0
