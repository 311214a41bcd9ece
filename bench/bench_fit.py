"""Benchmarks of `kvbridge fit` / transfer (prints markdown tables; no files written).

1. statistics accumulation throughput and solve time vs scikit-learn ``Ridge`` on the same
   materialised features (and the same coefficients, to 1e-4);
2. peak memory at 1e4 / 1e5 / 1e6 observations, each in a fresh subprocess (ru_maxrss above
   an empty baseline): streaming statistics vs sklearn's materialised fit;
3. transfer latency (strip RoPE + map + apply RoPE, and the mapping alone) vs the target's
   own prefill, at 512 and 2,048 tokens, on a realistic cache geometry (24 -> 28 layers,
   2 KV heads x 64 -> 128 dims, top-k 4) and on the tiny planted pair; the mapping's time vs
   its floor, max(FLOPs / measured matmul rate, bytes / measured copy bandwidth);
4. fit time (statistics + selection + solves, model forwards excluded) vs its FLOPs floor.

    .venv/bin/python bench/bench_fit.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def best_of(fn, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_rate(m: int, k: int, n: int, dtype=torch.float32, reps: int = 5) -> float:
    """Measured FLOP/s of an [m, k] @ [k, n] product (best of reps)."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    out = torch.empty(m, n, dtype=dtype)
    torch.mm(a, b, out=out)
    return 2 * m * k * n / best_of(lambda: torch.mm(a, b, out=out), reps)


def copy_bandwidth(nbytes: int = 1 << 27) -> float:
    """Measured bytes/s of a large float32 copy (read + write counted)."""
    a = torch.randn(nbytes // 4)
    b = torch.empty_like(a)
    b.copy_(a)
    return 2 * nbytes / best_of(lambda: b.copy_(a), 5)


def table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# -- 1. statistics vs sklearn ---------------------------------------------------------------------------
def synthetic(n: int, p: int, q: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, p, generator=g) * (1 + torch.rand(p, generator=g))
    w = torch.randn(p, q, generator=g) / p**0.5
    y = x @ w + 0.1 * torch.randn(n, q, generator=g)
    return x, y


def bench_stats_vs_sklearn(n: int, p: int, q: int, batch: int = 4096) -> str:
    import numpy as np
    from sklearn.linear_model import Ridge

    from kvbridge.fit.ridge import solve
    from kvbridge.fit.stats import MomentStats

    x, y = synthetic(n, p, q)

    def accumulate():
        s = MomentStats(p, q)
        for i in range(0, n, batch):
            s.update(x[i : i + batch], y[i : i + batch])
        return s

    t_acc = best_of(accumulate, 2)
    stats = accumulate()
    t_solve = best_of(lambda: solve(stats.moments(), 0.01), 3)
    w, b = solve(stats.moments(), 0.01)
    xd, yd = x.double().numpy(), y.double().numpy()
    t_sk = best_of(lambda: Ridge(alpha=0.01).fit(xd, yd), 2)
    ref = Ridge(alpha=0.01).fit(xd, yd)
    dw = float(np.abs(w.numpy() - ref.coef_.T).max())
    db = float(np.abs(b.numpy() - ref.intercept_).max())
    flops = 2 * n * (p * p + p * q)
    rows = [
        ["kvbridge streaming stats (float64)", f"{t_acc:.3f}", f"{n / t_acc:,.0f}", f"{flops / t_acc / 1e9:.1f}"],
        ["kvbridge solve (Cholesky, from stats)", f"{t_solve:.4f}", "", ""],
        ["kvbridge total", f"{t_acc + t_solve:.3f}", "", ""],
        ["sklearn Ridge(alpha=0.01).fit (materialised float64)", f"{t_sk:.3f}", f"{n / t_sk:,.0f}", ""],
    ]
    return (
        f"### Statistics + solve vs scikit-learn Ridge ({n:,} observations, {p} features -> {q} targets)\n\n"
        + table(["step", "seconds", "observations/s", "GFLOP/s"], rows)
        + f"\n\nSame coefficients: max |dW| = {dw:.1e}, max |db| = {db:.1e} (tolerance 1e-4).\n"
    )


# -- 2. memory ---------------------------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _memory_child(kind: str, n: int, p: int, q: int) -> None:
    """Run in a subprocess: accumulate (ridge) or materialise + fit (sklearn).

    Prints the peak resident memory reached during the work above the resident memory
    before it (KiB): the high-water mark is reset after the imports (``/proc/self/clear_refs``),
    so import-time peaks do not hide the work's own allocations.
    """
    import numpy as np
    from sklearn.linear_model import Ridge

    from kvbridge.fit.ridge import solve
    from kvbridge.fit.stats import MomentStats

    g = torch.Generator().manual_seed(0)
    w = torch.randn(p, q, generator=g) / p**0.5
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    start = _status_kib("VmRSS")
    if kind == "ridge":
        s = MomentStats(p, q)
        batch = 8192
        xb, yb, nb = torch.empty(batch, p), torch.empty(batch, q), torch.empty(batch, q)
        for i in range(0, n, batch):  # data generated into reused buffers: only the fit allocates
            m = min(batch, n - i)
            x, y = xb[:m], yb[:m]
            torch.randn(m, p, generator=g, out=x)
            torch.randn(m, q, generator=g, out=nb[:m])
            torch.addmm(nb[:m], x, w, beta=0.1, out=y)
            s.update(x, y)
        solve(s.moments(), 0.01)
    else:
        x = torch.randn(n, p, generator=g)
        y = x @ w + 0.1 * torch.randn(n, q, generator=g)
        xd, yd = x.double().numpy(), y.double().numpy()
        del x, y
        Ridge(alpha=0.01).fit(xd, yd)
        del np
    print(max(0, _status_kib("VmHWM") - start))


def bench_memory(ns, p: int, q: int) -> str:
    def run(kind, n):
        out = subprocess.run(
            [sys.executable, __file__, "--_mem", kind, str(n), str(p), str(q)],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout.strip().splitlines()[-1]) / 1024  # MiB

    rows = []
    for n in ns:
        t0 = time.perf_counter()
        r = run("ridge", n)
        tr = time.perf_counter() - t0
        t0 = time.perf_counter()
        s = run("sklearn", n)
        ts = time.perf_counter() - t0
        rows.append([f"{n:.0e}", f"{r:.1f}", f"{tr:.1f}", f"{s:.1f}", f"{ts:.1f}", f"{n * (p + q) * 8 / 2**20:.1f}"])
    from kvbridge.fit.stats import MomentStats

    return (
        f"### Peak memory of the work itself ({p} features -> {q} targets; MiB above the process's memory "
        "after imports, fresh process each; wall seconds include start-up)\n\n"
        + table(
            [
                "observations",
                "ridge (streaming) MiB",
                "ridge s",
                "sklearn (materialised) MiB",
                "sklearn s",
                "materialised X,Y float64 MiB",
            ],
            rows,
        )
        + f"\n\nThe statistics themselves hold {MomentStats.nbytes_for(p, q) / 2**20:.2f} MiB whatever the count; "
        "the streaming run's memory is that plus one batch.\n"
    )


# -- 3. transfer latency -------------------------------------------------------------------------------------
def llama_spec(layers, hidden, heads, kv, head_dim, **kw):
    from kvbridge.builtin.families._common import tiny_base
    from kvbridge.plugins import make_host

    cfg = tiny_base(
        "llama",
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        max_position_embeddings=4096,
        **kw,
    )
    adapter = make_host(entry_points=False).adapter_for(cfg)
    return cfg, adapter, adapter.describe(cfg)


def random_mapping(source_spec, target_spec, k: int, seed: int = 0):
    from kvbridge.fit.mapping import FittedMapping, LayerMap

    g = torch.Generator().manual_seed(seed)
    fs = source_spec.num_kv_heads * source_spec.head_dim
    ft = target_spec.num_kv_heads * target_spec.head_dim
    layers = []
    for t in range(target_spec.num_layers):
        src = tuple(int(i) for i in torch.randperm(source_spec.num_layers, generator=g)[:k])
        layers.append(
            LayerMap(
                "dense",
                src,
                torch.randn(k * fs, ft, generator=g) / (k * fs) ** 0.5,
                torch.randn(ft, generator=g),
                torch.randn(k * fs, ft, generator=g) / (k * fs) ** 0.5,
                torch.randn(ft, generator=g),
            )
        )
    return FittedMapping(source_spec, target_spec, layers)


def random_state(spec, tokens: int, seed: int = 0):
    from kvbridge.kvstate import KVState

    g = torch.Generator().manual_seed(seed)
    shape = (1, spec.num_kv_heads, tokens, spec.head_dim)
    ids = torch.randint(0, 100, (1, tokens), generator=g)
    return KVState(
        keys=tuple(torch.randn(shape, generator=g) for _ in range(spec.num_layers)),
        values=tuple(torch.randn(shape, generator=g) for _ in range(spec.num_layers)),
        token_ids=ids,
        positions=torch.arange(tokens)[None],
        spec=spec,
    )


def equivalent_gemms(mapping, tokens: int):
    """A callable doing the mapping's GEMMs alone (its FLOPs, on preallocated operands)."""
    ops = []
    for lm in mapping.layers:
        for w, b in ((lm.wk, lm.bk), (lm.wv, lm.bv)):
            ops.append((b, torch.randn(tokens, w.shape[0]), w, torch.empty(tokens, w.shape[1])))

    def run():
        for b, x, w, out in ops:
            torch.addmm(b, x, w, out=out)

    run()
    return run


def mapping_floor(mapping, tokens: int, rate: float, bandwidth: float) -> tuple[float, float, float]:
    s, t = mapping.source_spec, mapping.target_spec
    flops = mapping.flops(tokens)
    nbytes = 4 * (
        2 * s.num_layers * s.num_kv_heads * tokens * s.head_dim  # source K, V read
        + 2 * t.num_layers * t.num_kv_heads * tokens * t.head_dim  # target K, V written
        + sum(lm.wk.numel() + lm.wv.numel() for lm in mapping.layers)
    )  # weights read
    return max(flops / rate, nbytes / bandwidth), flops, nbytes


def bench_transfer(
    name: str, source_spec, target_cfg, target_adapter, target_spec, k: int, token_counts, rounds: int = 3
) -> tuple[str, list]:
    from kvbridge.transfer import transfer

    mapping = random_mapping(source_spec, target_spec, k)
    model = target_adapter.build_model(target_cfg, seed=0)
    bw = copy_bandwidth()
    rows, raw = [], []
    for tokens in token_counts:
        state = random_state(source_spec, tokens)
        content = state.strip_rope()
        gemms = equivalent_gemms(mapping, tokens)
        with torch.no_grad():
            # the floor's matmul rate is measured on exactly the mapping's GEMMs (same shapes, same
            # count); mapping, GEMMs, whole transfer and target prefill are timed in alternation,
            # best of `rounds` each, so a shared, busy CPU skews them alike
            ids = torch.randint(0, target_spec.vocab_size, (1, tokens))
            runs = {
                "map": lambda: mapping.map_tensors(content.keys, content.values),
                "gemm": gemms,
                "transfer": lambda: transfer(state, mapping, target_spec),
                "prefill": lambda: model(input_ids=ids, use_cache=True),
            }
            best = {k: float("inf") for k in runs}
            for _ in range(rounds):
                for key, fn in runs.items():
                    best[key] = min(best[key], best_of(fn, 1))
            t_map, t_gemm, t_all, t_pre = best["map"], best["gemm"], best["transfer"], best["prefill"]
            rate = mapping.flops(tokens) / t_gemm
        floor, flops, nbytes = mapping_floor(mapping, tokens, rate, bw)
        rows.append(
            [
                tokens,
                f"{1e3 * t_pre:.0f}",
                f"{1e3 * t_all:.1f}",
                f"{1e3 * t_map:.1f}",
                f"{t_pre / t_all:.1f}x",
                f"{flops / 1e9:.2f}",
                f"{nbytes / 2**20:.0f}",
                f"{rate / 1e9:.1f}",
                f"{1e3 * floor:.1f}",
                f"{t_map / floor:.2f}",
            ]
        )
        raw.append({"tokens": tokens, "prefill_s": t_pre, "transfer_s": t_all, "map_s": t_map, "floor_s": floor})
    head = [
        "tokens",
        "target prefill ms",
        "transfer ms (strip+map+RoPE)",
        "mapping ms",
        "prefill / transfer",
        "mapping GFLOP",
        "mapping MiB moved",
        "GEMM GFLOP/s (measured on the mapping's GEMMs)",
        "floor ms",
        "mapping / floor",
    ]
    return f"### Transfer vs target prefill: {name}\n\n" + table(
        head, rows
    ) + f"\n\nCopy bandwidth measured: {bw / 1e9:.1f} GB/s.\n", raw


# -- 4. fit time vs floor ----------------------------------------------------------------------------------
class SyntheticCalibration:
    """Pre-generated paired features (no model forwards), fed to the real fitter."""

    world = 1

    def __init__(self, ls, hs, ds, lt, ht, dt, n: int, *, batch: int = 2048, heldout: float = 0.1, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.batches = []
        true = torch.randint(0, ls, (lt,), generator=g)
        wk = torch.randn(hs * ds, ht * dt, generator=g) / (hs * ds) ** 0.5
        for i in range(0, n, batch):
            m = min(batch, n - i)
            feats = {}
            for c in ("k", "v"):
                x = torch.randn(m, ls, hs, ds, generator=g)
                y = (x[:, true].reshape(m, lt, -1) @ wk).reshape(m, lt, ht, dt) + 0.1 * torch.randn(
                    m, lt, ht, dt, generator=g
                )
                feats["x" + c], feats["y" + c] = x, y
            held = torch.rand(m, generator=g) < heldout
            self.batches.append((feats, held))
        self.n = n
        self.n_held = int(sum(int(h.sum()) for _, h in self.batches))
        self.true = true

    def observations(self, split="train"):
        return self.n_held if split == "held" else self.n - self.n_held

    def accumulate(self, jobs, *, tag="pass"):
        for feats, held in self.batches:
            for job in jobs:
                job.update(feats, held)
        return jobs


def fit_flops(ls, hs, ds, lt, ht, dt, n, k) -> float:
    p, q, fs, ft = ls * hs * ds, lt * ht * dt, hs * ds, ht * dt
    stats = 2 * 2 * n * (p * p + p * q)  # K and V: Cxx and Cxy GEMMs over every observation
    select = 2 * ls * (fs**3 / 3 + 2 * 2 * fs * fs * q)  # per source layer: Cholesky, solve, held-out Cxx W
    f = k * fs
    final = 2 * lt * (f**3 / 3 + 2 * 2 * f * f * ft)
    return stats + select + final


def bench_fit_floor(ls, hs, ds, lt, ht, dt, n, k) -> str:
    from kvbridge.fit.ridge import RidgeFitter

    _, _, sspec = llama_spec(ls, hs * 32, hs * 2, hs, ds)
    _, _, tspec = llama_spec(lt, ht * 32, ht * 2, ht, dt)
    cal = SyntheticCalibration(ls, hs, ds, lt, ht, dt, n)
    p, q = ls * hs * ds, lt * ht * dt
    sizes = [len(h) for _, h in cal.batches]
    xs = [torch.randn(m, p, dtype=torch.float64) for m in sizes]
    ys = [torch.randn(m, q, dtype=torch.float64) for m in sizes]
    cxx, cxy = torch.zeros(p, p, dtype=torch.float64), torch.zeros(p, q, dtype=torch.float64)

    def stats_gemms():  # the statistics' GEMMs alone: Cxx and Cxy updates of K and V, every batch
        for x, y in zip(xs, ys):
            for _ in ("k", "v"):
                cxx.addmm_(x.T, x)
                cxy.addmm_(x.T, y)

    # the fit and its GEMMs alone, alternated, best of 3 each (a shared CPU skews both alike)
    secs, t_gemm = float("inf"), float("inf")
    for _ in range(3):
        t_gemm = min(t_gemm, best_of(stats_gemms, 1))
        t0 = time.perf_counter()
        mapping = RidgeFitter().fit(sspec, tspec, cal, RidgeFitter.Options(top_k=k))
        secs = min(secs, time.perf_counter() - t0)
    rate = 2 * 2 * n * (p * p + p * q) / t_gemm
    flops = fit_flops(ls, hs, ds, lt, ht, dt, n, k)
    found = sum(int(sel[0] == int(t)) for sel, t in zip(mapping.layer_selection(), cal.true))
    rows = [
        [
            f"{ls}x{hs}x{ds} -> {lt}x{ht}x{dt}",
            k,
            f"{n:,}",
            f"{secs:.2f}",
            f"{flops / 1e9:.1f}",
            f"{rate / 1e9:.1f}",
            f"{flops / rate:.2f}",
            f"{secs / (flops / rate):.2f}",
            f"{mapping.report.r2_summary['mean']:.4f}",
            f"{found}/{lt}",
        ]
    ]
    return (
        "### Fit time (statistics + selection + solves; forwards excluded) vs its FLOPs floor\n\n"
        + table(
            [
                "geometry (layers x kv heads x dim)",
                "top-k",
                "observations",
                "fit s",
                "GFLOP (float64)",
                "float64 GEMM GFLOP/s (measured on the statistics' GEMMs)",
                "floor s",
                "fit / floor",
                "held-out R²",
                "true layer found",
            ],
            rows,
        )
        + "\n"
    )


def bench_accumulation_realistic(n: int) -> str:
    from kvbridge.fit.stats import LayerStats

    dims = dict(src_heads=2, src_dim=64, tgt_heads=2, tgt_dim=128)
    cal = SyntheticCalibration(24, 2, 64, 28, 2, 128, n, batch=min(n, 512))
    job = LayerStats(range(24), range(28), **dims)
    t0 = time.perf_counter()
    cal.accumulate([job])
    secs = time.perf_counter() - t0
    flops = 2 * 2 * n * (job.p**2 + job.p * job.q)
    return (
        f"### Joint statistics at the realistic geometry (24x2x64 -> 28x2x128: p={job.p}, q={job.q})\n\n"
        + table(
            ["observations", "seconds", "observations/s", "GFLOP/s (float64)", "statistics GiB (K,V x train,held)"],
            [[n, f"{secs:.2f}", f"{n / secs:,.0f}", f"{flops / secs / 1e9:.1f}", f"{job.nbytes() / 2**30:.2f}"]],
        )
        + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument(
        "--only",
        default="stats,memory,realistic,fit,transfer",
        help="comma-separated sections: stats, memory, realistic, fit, transfer",
    )
    ap.add_argument("--_mem", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._mem:
        kind, n, p, q = args._mem
        _memory_child(kind, int(n), int(p), int(q))
        return
    quick = args.quick
    print(
        f"# bench_fit (torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})\n"
    )
    only = set(args.only.split(","))
    if "stats" in only:
        print(bench_stats_vs_sklearn(4000 if quick else 20000, 512, 256))
    if "memory" in only:
        print(bench_memory((10_000, 100_000) if quick else (10_000, 100_000, 1_000_000), 128, 128))
    if "realistic" in only:
        print(bench_accumulation_realistic(128 if quick else 256))
    if "fit" in only:
        print(bench_fit_floor(8, 2, 64, 10, 2, 128, 2048 if quick else 8192, 4))
    if "transfer" not in only:
        return

    from kvbridge.builtin.families._common import tiny_base  # noqa: F401

    tokens = (512,) if quick else (512, 2048)
    _, _, src = llama_spec(24, 896, 14, 2, 64)
    tcfg, tad, tspec = llama_spec(28, 512, 4, 2, 128, intermediate_size=1408, vocab_size=8192)
    text, raw = bench_transfer(
        "realistic cache geometry 24x2x64 -> 28x2x128, top-k 4 "
        "(target model: 28 layers, hidden 512, 4 heads, MLP 1408)",
        src,
        tcfg,
        tad,
        tspec,
        4,
        tokens,
    )
    print(text)

    # what the ratio would be against a Qwen2.5-1.5B-sized target (28 layers, hidden 1536, MLP 8960, GQA 12/2):
    # prefill FLOPs scale with parameters and attention width, at the prefill rate measured above
    def prefill_flops(layers, hidden, heads, kv, hd, inter, t):
        per_layer = (
            2 * t * (hidden * heads * hd * 2 + hidden * kv * hd * 2 + 3 * hidden * inter) + 4 * t * t * heads * hd
        )
        return layers * per_layer

    rows = []
    for r in raw:
        t = r["tokens"]
        small = prefill_flops(28, 512, 4, 2, 128, 1408, t)
        big = prefill_flops(28, 1536, 12, 2, 128, 8960, t)
        est = r["prefill_s"] * big / small
        rows.append(
            [
                t,
                f"{small / 1e9:.0f}",
                f"{small / r['prefill_s'] / 1e9:.1f}",
                f"{big / 1e9:.0f}",
                f"{1e3 * est:.0f}",
                f"{est / r['transfer_s']:.0f}x",
            ]
        )
    print("### Extrapolated to a Qwen2.5-1.5B-sized target (same cache geometry), at the measured prefill rate\n")
    print(
        table(
            [
                "tokens",
                "measured prefill GFLOP",
                "prefill GFLOP/s",
                "1.5B-size prefill GFLOP",
                "estimated prefill ms",
                "estimated prefill / transfer",
            ],
            rows,
        )
        + "\n"
    )
    _, _, tiny_src = llama_spec(4, 64, 4, 2, 16)
    tiny_cfg, tiny_ad, tiny_tgt = llama_spec(6, 64, 4, 4, 16)
    text, _ = bench_transfer(
        "tiny planted-pair geometry 4x2x16 -> 6x4x16, top-k 2 (target: 6 layers, hidden 64)",
        tiny_src,
        tiny_cfg,
        tiny_ad,
        tiny_tgt,
        2,
        tokens,
    )
    print(text)


if __name__ == "__main__":
    main()
