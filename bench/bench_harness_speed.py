"""``kvbridge harness`` wall time, this checkout against an older one, alternating, same answers.

Each repeat runs the same harness command once per source tree (the order swapped on odd
repeats), each in a fresh process (model load included, as a user runs it), and records the wall
time, the load average before and after, and the result's per-item answers; at the end the
answers of every run are compared with the first (they must be identical).

    git archive d62bf5f src | tar -x -C /tmp/kvbridge-old    # the older tree
    python bench/bench_harness_speed.py --base /tmp/kvbridge-old/src --repeats 2 -- \\
        smollm2 smollm2 --mapping identity --tasks recall --limit 4 \\
        -o recall.lengths=256,1024 -o recall.positions=0.1,0.9 -o recall.n=1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(src: str, args: list) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = src
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "kvbridge", "harness", *args, "--json"], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(f"harness with {src} failed ({res.returncode}): {res.stderr[-1500:]}")
    out = json.loads(res.stdout)
    answers = {t: [(r["id"], r["scores"], r["answers"]) for r in recs] for t, recs in out["items"].items()}
    return {"wall": wall, "load": (load0, os.getloadavg()[0]), "answers": answers, "timing": out["timing"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", default=str(ROOT / "src"), help="this checkout's src (default)")
    ap.add_argument("--base", required=True, help="the older tree's src folder")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("harness_args", nargs=argparse.REMAINDER, help="after --: the harness arguments")
    a = ap.parse_args()
    args = [x for x in a.harness_args if x != "--"]
    print(f"# kvbridge harness {' '.join(args)}; {os.cpu_count()} CPUs; alternating, fresh process per run\n")
    runs: dict = {"ours": [], "base": []}
    for r in range(a.repeats):
        for side in ("ours", "base") if r % 2 == 0 else ("base", "ours"):
            res = run(a.ours if side == "ours" else a.base, args)
            runs[side].append(res)
            print(
                f"{side} run {r + 1}: {res['wall']:.1f} s wall, load average {res['load'][0]:.2f} -> "
                f"{res['load'][1]:.2f}; timing {json.dumps(res['timing'])}",
                flush=True,
            )
    first = runs["ours"][0]["answers"]
    same = all(x["answers"] == first for side in runs.values() for x in side)
    o, b = (statistics.median(x["wall"] for x in runs[s]) for s in ("ours", "base"))
    print(f"\nmedian wall: ours {o:.1f} s, base {b:.1f} s, base / ours {b / o:.2f}x; answers identical: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
