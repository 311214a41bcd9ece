"""The resource planner's time estimate (`kvbridge fit --plan --calibrate`) against measured fits.

For each (pair, tokens): the rates are measured once per pair (`kvbridge.fit.plan_rates.measure_rates`,
at the fit's shapes: one random-weight decoder layer of each model, the float64 GEMM and solve,
memory and sha256), the plan's estimate is the sum of its parts at those rates, and the fit
(`kvbridge.fit.fit`, ridge, random token ids, seq-len 512, --stride, --top-k, written to a
temporary folder) is timed in CPU seconds of this process with --threads threads (1 by
default: CPU time is then robust to a shared machine). Models are loaded before the timing
(loading is not part of a fit). Target: |estimate / measured - 1| <= 15%.

    python bench/bench_plan.py [--threads 1] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

#: (source, target, token counts)
CASES = [
    ("zoo:base", "zoo:wide", (4096, 16384)),
    ("zoo:wide", "zoo:base", (8192,)),
    ("zoo:odd", "zoo:wide", (8192,)),
    ("smollm2", "smollm2", (2048, 4096)),
]
QUICK = [("zoo:base", "zoo:wide", (4096,))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="fits per case (median; the first fit of a pair pays one-off costs, 10-30%% on the zoo)",
    )
    ap.add_argument("--stride", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one small zoo case (a smoke run)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from kvbridge.fit import fit
    from kvbridge.fit.plan import plan
    from kvbridge.fit.plan_rates import measure_rates
    from kvbridge.models import load

    print(
        f"# bench_plan: planner estimate vs measured fit (ridge, top-k {args.top_k}, seq-len 512, stride "
        f"{args.stride}, batch 4), {torch.get_num_threads()} thread(s), CPU seconds, load average "
        f"{os.getloadavg()[0]:.1f}, torch {torch.__version__}\n"
    )
    print(
        "| source -> target | tokens | calibration s | estimate s | forwards | statistics | solves | memory "
        "| fingerprints | measured s | estimate / measured |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for src_ref, tgt_ref, counts in QUICK if args.quick else CASES:
        c0 = time.process_time()
        rates = measure_rates(src_ref, tgt_ref, seq_len=512, batch_size=4, stride=args.stride, top_k=args.top_k)
        cal_s = time.process_time() - c0
        src = load(src_ref, dtype="float32").model
        tgt = src if tgt_ref == src_ref else load(tgt_ref, dtype="float32").model
        for n in counts:
            p = plan(src_ref, tgt_ref, tokens=n, seq_len=512, stride=args.stride, top_k=args.top_k, rates=rates)
            ids = torch.randint(
                10, min(src.config.vocab_size, tgt.config.vocab_size), (n,), generator=torch.Generator().manual_seed(1)
            )
            times = []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory(prefix="kvbridge-plan-") as tmp:
                    t0 = time.process_time()
                    fit(
                        src,
                        tgt,
                        ids,
                        seq_len=512,
                        stride=args.stride,
                        out=f"{tmp}/map",
                        overwrite=True,
                        distributed=None,
                        top_k=args.top_k,
                    )
                    times.append(time.process_time() - t0)
            measured = statistics.median(times)
            parts = p.time_parts()
            fwd = parts["source forwards"] + parts["target forwards"]
            ratio = p.seconds / measured
            worst = max(worst, abs(ratio - 1))
            print(
                f"| {src_ref} -> {tgt_ref} | {n:,} | {cal_s:.1f} | {p.seconds:.2f} | {fwd:.2f} | "
                f"{parts['statistics']:.2f} | {parts['solves']:.2f} | {parts['memory']:.2f} | "
                f"{parts['fingerprints']:.2f} | {measured:.2f} | {ratio:.2f} |",
                flush=True,
            )
        del src, tgt
    print(f"\nworst |estimate / measured - 1|: {100 * worst:.0f}% (target <= 15%)", file=sys.stdout)


if __name__ == "__main__":
    main()
