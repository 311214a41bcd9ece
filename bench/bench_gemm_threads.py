"""Why the blocked map splits worse across two threads than its floor (issue 35): the floor's ONE
``mm`` ([T, 512] @ [512, 14,336]) against the blocked map's GEMM shape (per target layer, K and V,
and block of 2,048 tokens: ``addmm`` [2,048, 512] @ [512, 256] into a warm output), the same FLOPs,
each timed at 1 and 2 threads alternating in one process (wall clock, medians of ``--repeats``).

    python bench/bench_gemm_threads.py --tokens 8192 --repeats 7

``--stages``: the dense map of ``bench_peer.py``'s inputs at ``--tokens`` (one token block: up to
2,048) and ``--threads``, in ONE process, alternating (order reversed every round), each with the CPU
time of its busiest threads (``/proc/self/task/*/schedstat``: whether a thread sits idle): the floor
(``bench_peer.py``'s one ``mm``), the map with fresh results, with its results reused (``work=``),
the map with ``GATHER_BYTES`` of 32 MiB (session 8's) and of other sizes, with ``populate`` off, and
its two stages alone on warm buffers (the ``torch.stack`` gathers and the strided ``baddbmm`` calls,
K and V, blocks of 32 MiB). Every map's output is checked ``torch.equal`` to the first.

    python bench/bench_gemm_threads.py --stages --tokens 2048 --threads 2 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def busy() -> dict:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/schedstat") as fh:
            out[tid] = int(fh.read().split()[0])
    return out


def stages(tokens: int, threads: int, repeats: int) -> None:
    """``--stages``: the one-block dense map's variants and stages, alternating in one process."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_peer import Ours, cache_inputs, floor_operands, mapping_inputs, parse_geometry

    from kvbridge.fit import mapping as M

    torch.set_num_threads(threads)
    src, tgt = parse_geometry("24x2x64-28x2x128")
    m = Ours(src, tgt).mapping(mapping_inputs(src, tgt))
    keys, values = cache_inputs(src, tokens)
    x, w, o = floor_operands(src, tgt, tokens)
    default, populate = M.GATHER_BYTES, M.populate

    def variant(gather=None, work=None, pop=True):
        def fn():
            M.GATHER_BYTES = gather or default
            M.populate = populate if pop else (lambda t, threads=None: t)
            try:
                return m.map_tensors(keys, values) if work is None else m.map_tensors(keys, values, work=work)
            finally:
                M.GATHER_BYTES, M.populate = default, populate

        return fn

    (ls, sel, wk, bk), (_, _, wv, bv) = m._dense_plan("cpu")["k"][0], m._dense_plan("cpu")["v"][0]
    fs, g, k = src[1] * src[2], len(ls), len(sel) // len(ls)
    step = max(1, min(g, (32 << 20) // (4 * tokens * k * fs)))  # session 8's blocks: 32 MiB of features
    gbuf, rbuf = torch.empty(tokens * step * k * fs), torch.empty(g, tokens, wk.shape[-1])
    srcs = {"k": [t.transpose(1, 2) for t in keys], "v": [t.transpose(1, 2) for t in values]}

    def stage(which):  # _map_dense's one-block loop, one of its two operations, warm buffers
        for name, wt, bias in (("k", wk, bk), ("v", wv, bv)):
            for a in range(0, g, step):
                e = min(g, a + step)
                feats = gbuf[: tokens * (e - a) * k * fs].view(1, tokens, (e - a) * k, src[1], src[2])
                if which == "stack":
                    torch.stack([srcs[name][s] for s in sel[a * k : e * k]], dim=2, out=feats)
                else:
                    a_ = feats.view(tokens, e - a, k * fs).transpose(0, 1)
                    torch.baddbmm(bias[a:e], a_, wt[a:e], out=rbuf[a:e])

    fns = {
        "floor": lambda: torch.mm(x, w, out=o),
        "map (fresh results)": variant(),
        "map, results reused (work=)": variant(work={}),
        "map, gather 32 MiB": variant(32 << 20),
        "map, gather 16 MiB": variant(16 << 20),
        "map, gather 8 MiB": variant(8 << 20),
        "map, populate off": variant(pop=False),
        "stack alone (32 MiB blocks)": lambda: stage("stack"),
        "baddbmm alone (32 MiB blocks)": lambda: stage("baddbmm"),
    }
    res: dict = {n: [] for n in fns}
    ref = None
    for r in range(repeats + 1):  # the first round warms up
        for name, fn in fns.items() if r % 2 == 0 else list(fns.items())[::-1]:
            b0, t0 = busy(), time.perf_counter()
            out = fn()
            wall, b1 = time.perf_counter() - t0, busy()
            if name.startswith("map"):
                flat = torch.cat([t.reshape(-1) for t in out[0] + out[1]])
                ref = flat if ref is None else ref
                assert torch.equal(ref, flat), name
            del out
            if r:
                res[name].append((wall, sorted(((b1[t] - b0.get(t, 0)) / 1e6 for t in b1), reverse=True)[:2]))
    floor = statistics.median(v[0] for v in res["floor"])
    print(
        f"# bench_gemm_threads --stages: {tokens} tokens, {threads} thread(s), GATHER_BYTES {default >> 20} MiB, "
        f"one process, medians of {repeats}; load {os.getloadavg()[0]:.2f}; every map torch.equal"
    )
    print("| variant | wall ms | / floor | its two busiest threads on a CPU, ms |")
    print("|---|---:|---:|---|")
    for name, v in res.items():
        wall = statistics.median(x[0] for x in v)
        th = [statistics.median(x[1][j] for x in v if len(x[1]) > j) for j in range(2)]
        print(f"| {name} | {1e3 * wall:.1f} | {wall / floor:.2f} | {th[0]:.0f} / {th[1]:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--stages", action="store_true", help="the one-block dense map's variants and stages")
    ap.add_argument("--threads", type=int, default=2, help="--stages: torch threads")
    args = ap.parse_args()
    if args.stages:
        stages(args.tokens, args.threads, args.repeats)
        return
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
