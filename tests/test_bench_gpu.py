"""bench/bench_gpu.py (the script bench/gpu.sh runs on a CUDA machine) runs on the CPU at tiny sizes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_gpu.py"


@pytest.mark.slow
def test_device_bench_runs_on_cpu_at_tiny_sizes(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "r.json"
    res = mod.main(["--device", "cpu", "--sizes", "tiny", "--tokens", "16", "--repeats", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert res["dtype"] == "float32" and res["sizes"] == "tiny"  # the CPU side of the dtype policy
    row = res["rows"][0]
    assert row["stats"]["observations"] == 16 and row["stats"]["statistics_bytes"] > 0
    assert row["mapping"]["seconds"] > 0 and row["mapping"]["flops"] > 0
    m = row["mapping"]
    assert m["mm_floor_seconds"] > 0 and m["map_over_mm_floor"] == pytest.approx(m["seconds"] / m["mm_floor_seconds"])
    assert m["transfer_over_mm_floor"] == pytest.approx(m["transfer_seconds"] / m["mm_floor_seconds"])
    assert m["transfer_peak_bytes"] is None  # device memory: CUDA only
    assert set(row["rope"]) == {"strip", "apply", "reposition", "floor_seconds"}
    assert row["transfer"]["prefill_seconds"] > 0 and row["transfer"]["pack_bytes"] > 0
    assert "| 16 |" in capsys.readouterr().out


def test_gpu_script_is_prepared():
    script = BENCH.parent / "gpu.sh"
    text = script.read_text()
    assert script.stat().st_mode & 0o111  # executable
    assert "--device cuda" in text and "2048,8192,32768" in text and "timeout" in text
