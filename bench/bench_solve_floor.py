"""The float64 solves' floor on this CPU: LAPACK ``potrf`` / ``potrs`` at the fit's sizes against a
GEMM of the same FLOPs, a triangular solve, a recursive Cholesky (two halves, TRSM + GEMM), and the
float32 accumulation strip, at 1 and 2 threads (medians of 7 x 5 calls; milliseconds and GFLOP/s).

    python bench/bench_solve_floor.py            # JSON on stdout

BENCHMARKS.md, "Issue 35: the fit's solves and the plan's rate (session 12)" quotes its figures.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

F64 = torch.float64


def spd(p: int, gen: torch.Generator, n: int = 2048) -> torch.Tensor:
    x = torch.randn(n, p, generator=gen, dtype=F64)
    return x.T @ x + 0.01 * torch.eye(p, dtype=F64)


def recursive_cholesky(a: torch.Tensor, leaf: int) -> torch.Tensor:
    n = a.shape[0]
    if n <= leaf:
        return torch.linalg.cholesky_ex(a)[0]
    h = n // 2
    low = torch.zeros_like(a)
    l11 = recursive_cholesky(a[:h, :h], leaf)
    l21 = torch.linalg.solve_triangular(l11.mT, a[h:, :h], upper=True, left=False)
    low[:h, :h], low[h:, :h] = l11, l21
    low[h:, h:] = recursive_cholesky(torch.addmm(a[h:, h:], l21, l21.mT, alpha=-1), leaf)
    return low


def median_seconds(fn, reps: int = 7, inner: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t) / inner)
    return statistics.median(times)


def measure(threads: int) -> dict:
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    a = spd(512, gen)
    b = torch.randn(512, 256, generator=gen, dtype=F64)
    low = torch.linalg.cholesky(a)
    a1 = spd(128, gen)
    c = torch.randn(128, 7168, generator=gen, dtype=F64)
    x, y = torch.randn(1024, 3072, generator=gen), torch.randn(1024, 7168, generator=gen)
    out = torch.empty(512, 7168)
    cases = {  # name: (call, FLOPs, reps, inner)
        "potrf512": (lambda: torch.linalg.cholesky_ex(a), 512**3 / 3, 7, 5),
        "recursive256": (lambda: recursive_cholesky(a, 256), 512**3 / 3, 7, 5),
        "recursive128": (lambda: recursive_cholesky(a, 128), 512**3 / 3, 7, 5),
        "potrs512x256": (lambda: torch.cholesky_solve(b, low), 2 * 512 * 512 * 256, 7, 5),
        "trsm_pair512x256": (
            lambda: torch.linalg.solve_triangular(
                low.mT, torch.linalg.solve_triangular(low, b, upper=False), upper=True
            ),
            2 * 512 * 512 * 256,
            7,
            5,
        ),
        "dgemm512x512x256": (lambda: a @ b, 2 * 512 * 512 * 256, 7, 5),
        "selection_gemm128x7168": (lambda: a1 @ c, 2 * 128 * 128 * 7168, 7, 5),
        "selection_trsm128x7168": (
            lambda: torch.linalg.solve_triangular(a1.tril(), c, upper=False),
            128 * 128 * 7168,
            7,
            5,
        ),
        "sgemm_strip512x1024x7168": (lambda: x[:, :512].T @ y, 2 * 512 * 1024 * 7168, 5, 2),
        "sgemm_strip_out": (lambda: torch.mm(x[:, :512].T, y, out=out), 2 * 512 * 1024 * 7168, 5, 2),
    }
    row = {}
    for name, (fn, flops, reps, inner) in cases.items():
        s = median_seconds(fn, reps, inner)
        row[name] = {"ms": round(s * 1e3, 3), "gflops": round(flops / s / 1e9, 1)}
    rec = recursive_cholesky(a, 128)
    row["recursive_vs_potrf_relative"] = float((rec - low).abs().max() / low.abs().max())
    return row


def main() -> None:
    print(json.dumps({str(t): measure(t) for t in (1, 2)}, indent=1))


if __name__ == "__main__":
    main()
