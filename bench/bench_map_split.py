"""The map and the transfer against the one-``mm`` floor, and their parts, in one process.

24x2x64 -> 28x2x128, top-k 4, float32, the inputs of ``bench/bench_peer.py`` (same seeds): the floor
(ONE ``torch.mm`` with the mapping's FLOPs into a warm output), ``map_tensors``, the whole
``transfer`` (strip + map + apply), and the strip and the re-application alone, run alternately
``--repeats`` times after a warm-up; medians and mins. With ``--threads 1`` (default) the clock is
the process's CPU time (robust to a shared machine), else wall time. ``--ops`` also times the
operations a dense map is made of, per K or V (the gather into a fresh tensor or a reused buffer,
the selected layers stacked straight from the source, a fresh result, the layout copy, the
batched GEMM), and ``--profile`` prints the torch profiler's
split of one map and one transfer.

Above 8,192 tokens (``kvbridge.transfer.BLOCKS_ABOVE``) the two columns are two different paths: "map"
is ``map_tensors`` over the whole cache (1.9 GiB of fresh results at 32,768 tokens; no command runs
it there), "transfer" the token-block transfer ``kvbridge transfer`` runs. Both run here in one
process that also holds a mapped 32K state and has just freed the other's gigabytes, which at 32,768
tokens read 1.21-1.59x (map) and 1.63-1.82x (transfer) the floor in quiet runs, against 1.19 and 1.43
for each in a process of its own (BENCHMARKS.md, "Issue 35: two threads, 32K settled"): the figure a
user meets is ``bench/bench_map_faults.py --modes floor,transfer`` (fresh child processes).

    python bench/bench_map_split.py [--tokens 512,2048] [--threads 1] [--repeats 5] [--ops] [--profile]
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
from bench_map_inputs import state_of  # noqa: E402
from bench_peer import Ours, cache_inputs, floor_operands, mapping_inputs, parse_geometry  # noqa: E402


def alternate(fns: dict, repeats: int, clock) -> dict:
    for f in fns.values():
        f()
    out = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = clock()
            f()
            out[k].append(clock() - t0)
    return {k: (statistics.median(v), min(v)) for k, v in out.items()}


def ops(n: int, repeats: int, clock) -> dict:
    """The operations of one dense map of K (or V), each alone."""
    ls, hs, ds, lt, ht, dt, k = 24, 2, 64, 28, 2, 128, 4
    fs, q = hs * ds, ht * dt
    g = torch.Generator().manual_seed(0)
    src = [torch.randn(1, hs, n, ds, generator=g) for _ in range(ls)]
    idx = torch.stack([torch.randperm(ls, generator=g)[:k] for _ in range(lt)])
    w, bias = torch.randn(lt, k * fs, q, generator=g), torch.randn(lt, 1, q, generator=g)
    s3 = torch.stack([x.transpose(1, 2) for x in src], dim=2).view(n, ls, fs)
    rows = s3.reshape(n * ls, fs)
    flat_rows = ((torch.arange(n) * ls)[None, :, None] + idx[:, None, :]).reshape(-1)
    buf = torch.empty(n, lt * k, fs)
    sel = [int(s) for s in idx.reshape(-1)]
    feats = rows.index_select(0, flat_rows).view(lt, n, k * fs)
    res = torch.empty(lt, n, q)
    y = torch.empty(lt, ht, n, dt)
    x, wf, outf = floor_operands((ls, hs, ds), (lt, ht, dt), n)
    half = outf[:, : lt * q]
    from kvbridge.fit.mapping import fresh

    return alternate(
        {
            "floor (one mm, half of it: K only)": lambda: torch.mm(x, wf[:, : lt * q], out=half),
            "stack the source layers": lambda: torch.stack([t.transpose(1, 2) for t in src], dim=2),
            "row index_select into a fresh tensor": lambda: rows.index_select(0, flat_rows),
            "layer-dim index_select into a reused buffer": lambda: torch.index_select(s3, 1, idx.reshape(-1), out=buf),
            "selected layers stacked from the source into a reused buffer (no source stack)": lambda: torch.stack(
                [src[s].transpose(1, 2) for s in sel], dim=2, out=buf.view(1, n, lt * k, hs, ds)
            ),
            "fresh result, 4 KiB pages (torch.empty + fill)": lambda: torch.empty(lt, n, q).fill_(0),
            "fresh result, 2 MiB pages (fresh + fill)": lambda: fresh((lt, n, q)).fill_(0),
            "copy into the target layout": lambda: y.copy_(res.view(lt, n, ht, dt).permute(0, 2, 1, 3)),
            "baddbmm, contiguous, warm output": lambda: torch.baddbmm(bias, feats, w, out=res),
        },
        repeats,
        clock,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ops", action="store_true")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    src, tgt = parse_geometry("24x2x64-28x2x128")
    side = Ours(src, tgt)
    inputs = mapping_inputs(src, tgt)
    mapping = side.mapping(inputs)
    print(
        f"# bench_map_split: 24x2x64 -> 28x2x128, top-k 4, float32, {torch.get_num_threads()} thread(s), "
        f"{'CPU' if args.threads == 1 else 'wall'} clock, {args.repeats} repeats; load average "
        f"{' / '.join(f'{v:.1f}' for v in os.getloadavg())}\n"
    )
    print("| tokens | floor ms | map ms | transfer ms | strip ms | apply ms | map / floor | transfer / floor |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in [int(t) for t in args.tokens.split(",")]:
        keys, values = cache_inputs(src, n)
        do_map, do_transfer = side.map_calls(inputs, keys, values)
        x, w, out = floor_operands(src, tgt, n)
        state = state_of(keys, values, side.spec_s)
        mapped = mapping.map_content(state.strip_rope(dtype=torch.float32), side.spec_t)
        r = alternate(
            {
                "floor": lambda: torch.mm(x, w, out=out),
                "map": do_map,
                "transfer": do_transfer,
                "strip": lambda: state.strip_rope(dtype=torch.float32),
                "apply": lambda: mapped.apply_rope(mapped.positions, spec=side.spec_t, dtype=torch.float32),
            },
            args.repeats,
            clock,
        )
        f = r["floor"]
        print(
            f"| {n:,} | "
            + " | ".join(
                f"{1e3 * r[k][0]:.1f} ({1e3 * r[k][1]:.1f})" for k in ("floor", "map", "transfer", "strip", "apply")
            )
            + f" | {r['map'][0] / f[0]:.2f} (min {r['map'][1] / f[1]:.2f}) | "
            f"{r['transfer'][0] / f[0]:.2f} (min {r['transfer'][1] / f[1]:.2f}) |",
            flush=True,
        )
        if args.profile:
            from torch.profiler import profile

            for what, fn in (("map", do_map), ("transfer", do_transfer)):
                with profile() as prof:
                    fn()
                ev = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:6]
                total = sum(e.self_cpu_time_total for e in prof.key_averages())
                print(
                    f"\n  {n:,} tokens, one {what} ({total / 1e3:,.0f} ms of operator self time): "
                    + ", ".join(f"{e.key} {e.self_cpu_time_total / total:.0%} ({e.count} calls)" for e in ev)
                    + "\n",
                    flush=True,
                )
        if args.ops:
            print(f"\n  {n:,} tokens, the operations of one dense map of K (median / min ms):")
            for k, (m, lo) in ops(n, args.repeats, clock).items():
                print(f"  - {k}: {1e3 * m:.1f} / {1e3 * lo:.1f}")
            print(flush=True)


if __name__ == "__main__":
    main()
