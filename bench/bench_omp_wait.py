"""The map at two threads with OpenMP's waiting threads sleeping (``OMP_WAIT_POLICY=PASSIVE``) or not.

Alternating child processes, one with ``OMP_WAIT_POLICY=PASSIVE`` in its environment and one with the
variable unset (libgomp's default: waiting threads spin a while before they sleep), each timing the
dense map of ``bench/bench_peer.py``'s inputs (24x2x64 -> 28x2x128, top-k 4, float32) ``--repeats``
times after a warm-up at ``--threads`` threads, wall clock. Prints each child's median and min and the
load average around it, then the medians over the children.

    python bench/bench_omp_wait.py [--tokens 2048] [--threads 2] [--rounds 4] [--repeats 5]
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

HERE = Path(__file__).resolve().parent


def child(tokens: int, threads: int, repeats: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(HERE))
    from bench_peer import Ours, cache_inputs, mapping_inputs, parse_geometry

    src, tgt = parse_geometry("24x2x64-28x2x128")
    side = Ours(src, tgt)
    m = side.mapping(mapping_inputs(src, tgt))
    keys, values = cache_inputs(src, tokens)
    m.map_tensors(keys, values)
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        m.map_tensors(keys, values)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {
        "policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
        "median_ms": 1e3 * statistics.median(wall),
        "min_ms": 1e3 * min(wall),
        "cpu_ms": 1e3 * statistics.median(cpu),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.tokens, args.threads, args.repeats)))
        return
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    envs = {"PASSIVE": dict(base, OMP_WAIT_POLICY="PASSIVE"), "unset": base}
    got: dict = {k: [] for k in envs}
    cmd = [sys.executable, __file__, "--child", "--tokens", str(args.tokens), "--threads", str(args.threads)]
    cmd += ["--repeats", str(args.repeats)]
    print(f"# map, {args.tokens:,} tokens, {args.threads} threads, wall clock; children alternating")
    print("| round | policy | load average before | median ms | min ms | CPU ms (median) |")
    print("|---:|---|---:|---:|---:|---:|")
    for i in range(args.rounds):
        for name, env in envs.items() if i % 2 == 0 else reversed(envs.items()):
            load = os.getloadavg()[0]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode:
                raise SystemExit(f"child failed: {out.stderr[-400:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            got[name].append(r)
            print(
                f"| {i + 1} | {name} | {load:.1f} | {r['median_ms']:.0f} | {r['min_ms']:.0f} | {r['cpu_ms']:.0f} |",
                flush=True,
            )
    print()
    for name, rs in got.items():
        print(
            f"{name}: median of the children's medians {statistics.median(r['median_ms'] for r in rs):.0f} ms, "
            f"min {min(r['min_ms'] for r in rs):.0f} ms"
        )
    print(f"load average after: {' / '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
