"""The fitted mapping vs its FLOP floor at the realistic geometry, and where its time goes.

24x2x64 -> 28x2x128 (a Qwen2.5-0.5B-like source cache, a Qwen2.5-1.5B-like target), top-k 4,
dense ridge layout, float32. The floor is a bare ``addmm`` of exactly the mapping's GEMMs (same
shapes and count, preallocated operands and outputs): the mapping cannot do less arithmetic.
Mapping and floor run alternately, ``--repeats`` times, median and min; ``--clock cpu`` (default)
uses this process's CPU time, which with ``--threads 1`` (default) is robust to a shared machine.
A torch profiler pass then splits one mapping call by operator.

    python bench/bench_mapping.py [--tokens 512,2048] [--repeats 9] [--threads 1] [--clock cpu|wall]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fit import equivalent_gemms, llama_spec, random_mapping, random_state  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    _, _, src = llama_spec(24, 896, 14, 2, 64)
    _, _, tgt = llama_spec(28, 512, 4, 2, 128)
    mapping = random_mapping(src, tgt, 4)
    print(
        f"# bench_mapping: 24x2x64 -> 28x2x128, top-k 4, float32, {torch.get_num_threads()} thread(s), "
        f"{args.clock} clock, load average {os.getloadavg()[0]:.1f}, torch {torch.__version__}\n"
    )
    print("| tokens | GFLOP | mapping ms (median) | floor ms (median) | mapping / floor (median) | (min / min) |")
    print("|---:|---:|---:|---:|---:|---:|")
    profiles = []
    for n in [int(x) for x in args.tokens.split(",")]:
        content = random_state(src, n).strip_rope()
        floor = equivalent_gemms(mapping, n)

        def run():
            return mapping.map_tensors(content.keys, content.values)

        run()
        floor()
        a, b = [], []
        with torch.no_grad():
            for _ in range(args.repeats):
                for fn, out in ((run, a), (floor, b)):
                    t0 = clock()
                    fn()
                    out.append(clock() - t0)
        ma, mb = statistics.median(a), statistics.median(b)
        print(
            f"| {n:,} | {mapping.flops(n) / 1e9:.2f} | {1e3 * ma:.1f} | {1e3 * mb:.1f} | {ma / mb:.2f} | "
            f"{min(a) / min(b):.2f} |"
        )
        from torch.profiler import profile

        with profile() as prof:
            run()
        total = sum(e.self_cpu_time_total for e in prof.key_averages())
        top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:4]
        profiles.append(
            f"{n:,} tokens: " + ", ".join(f"{e.key} {e.self_cpu_time_total / total:.0%} ({e.count} calls)" for e in top)
        )
    print("\nWhere one mapping call's time goes (torch profiler, self CPU time):\n")
    for line in profiles:
        print(f"- {line}")


if __name__ == "__main__":
    main()
