"""Why the blocked map splits worse across two threads than its floor (issue 35): the floor's ONE
``mm`` ([T, 512] @ [512, 14,336]) against the blocked map's GEMM shape (per target layer, K and V,
and block of 2,048 tokens: ``addmm`` [2,048, 512] @ [512, 256] into a warm output), the same FLOPs,
each timed at 1 and 2 threads alternating in one process (wall clock, medians of ``--repeats``).

    python bench/bench_gemm_threads.py --tokens 8192 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    t, f, layers, cols, block = args.tokens, 512, 28, 256, 2048
    x, w, out = (
        torch.randn(t, f, generator=g),
        torch.randn(f, 2 * layers * cols, generator=g),
        torch.empty(t, 2 * layers * cols),
    )
    wl = [torch.randn(f, cols, generator=g) for _ in range(2 * layers)]
    bias = torch.randn(cols, generator=g)
    outs = [torch.empty(t, cols) for _ in range(2 * layers)]

    src = [torch.randn(1, 2, t, 64, generator=g) for _ in range(24)]  # the source layers, [B, H, T, D]
    buf = torch.empty(4, 1, 2, block, 64)

    def gather():  # the blocked map's copies: per target layer, K and V, and block, its 4 selected slices
        for i in range(2 * layers):
            sel = [src[(i * 7 + j * 5) % 24] for j in range(4)]
            for a in range(0, t, block):
                torch.stack([s[:, :, a : a + block] for s in sel], out=buf)

    def floor():
        torch.mm(x, w, out=out)

    def blocked():
        for i in range(2 * layers):
            for a in range(0, t, block):
                torch.addmm(bias, x[a : a + block], wl[i], out=outs[i][a : a + block])

    res = {}
    for _ in range(args.repeats + 1):  # the first round warms up
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for name, fn in (("floor", floor), ("blocked", blocked), ("gather", gather)):
                t0 = time.perf_counter()
                fn()
                res.setdefault((threads, name), []).append(time.perf_counter() - t0)
    med = {k: statistics.median(v[1:]) * 1e3 for k, v in res.items()}
    print(f"# bench_gemm_threads: {t} tokens, wall clock, medians of {args.repeats}; load {os.getloadavg()[0]:.1f}")
    print("| GEMM | 1 thread ms | 2 threads ms | 1 / 2 threads |")
    print("|---|---:|---:|---:|")
    for name, label in (
        ("gather", f"gather: {2 * layers} x {max(1, t // block)} stacks of 4 source slices [1, 2, {block}, 64]"),
        ("floor", f"floor: one mm [{t}, 512] @ [512, {2 * layers * cols}]"),
        ("blocked", f"blocked: {2 * layers} x {max(1, t // block)} addmm [{block}, 512] @ [512, {cols}]"),
    ):
        a, b = med[(1, name)], med[(2, name)]
        print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    print(
        f"blocked / floor: 1 thread {med[(1, 'blocked')] / med[(1, 'floor')]:.2f}, "
        f"2 threads {med[(2, 'blocked')] / med[(2, 'floor')]:.2f}"
    )


if __name__ == "__main__":
    main()
