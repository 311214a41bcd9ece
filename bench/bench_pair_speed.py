"""Transfer against the target's own prefill on the real pair (Qwen2.5-Coder 0.5B -> 1.5B), by length.

    flock /tmp/kvbridge-heavy.lock python bench/bench_pair_speed.py --mapping /work/pair-runs/run1/map-k4-a0.01 \
        [--lengths 512,2048,8192,32768] [--prefill-lengths 512,2048,8192] [--repeats 3]

**transfer** = what a transfer costs once the source holds the cache: strip the source's RoPE, map
(the fitted mapping, top-k 4), re-apply the 1.5B's RoPE, inject into the 1.5B's cache layout
(``kvbridge.transfer.transfer`` + the adapter's ``inject``), on a source state of the 0.5B's
geometry (24 x 2 x 64) with random values (the cost does not depend on them). **prefill** = the
1.5B (dequantized float32, sdpa attention) running the same number of tokens in one forward
(``use_cache=True``, ``logits_to_keep=1``), random token ids. Medians of ``--repeats`` (prefill:
one run per length; it is the slow side). Peak memory: the process's resident high-water mark
after each step (steps run in increasing cost: every transfer first, then the prefills), and the
bytes of the transferred cache itself.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mapping", type=Path, required=True, help="a kvbridge fit folder for 0.5B -> 1.5B")
    ap.add_argument("--lengths", default="512,2048,8192,32768")
    ap.add_argument("--prefill-lengths", default="512,2048,8192")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_fit import random_state

    from kvbridge.fit.artifact import load_mapping
    from kvbridge.models import load
    from kvbridge.plugins import get_host
    from kvbridge.transfer import transfer

    host = get_host()
    mapping = load_mapping(args.mapping, host=host)
    t0 = time.perf_counter()
    big = load("qwen2.5-coder-1.5b", dtype="float32", host=host)
    model = big.model.eval()
    load_s = time.perf_counter() - t0
    tad = host.adapter_of(model)
    print(f"loaded the 1.5B in {load_s:.0f} s, peak RSS {rss_gib():.2f} GiB, {torch.get_num_threads()} threads",
          file=sys.stderr, flush=True)
    rows = {}
    with torch.no_grad():
        for n in [int(x) for x in args.lengths.split(",") if x]:
            state = random_state(mapping.source_spec, n)
            times = []
            for _ in range(args.repeats):
                t1 = time.perf_counter()
                moved = transfer(state, mapping, host=host)
                cache = tad.inject(moved, model)
                times.append(time.perf_counter() - t1)
            nbytes = sum(t.numel() * t.element_size() for t in (*moved.keys, *moved.values))
            rows[n] = {"tokens": n, "transfer_s": statistics.median(times), "cache_mib": nbytes / 2**20,
                       "peak_rss_gib_after_transfer": rss_gib()}
            del state, moved, cache
            print(f"transfer {n}: {rows[n]['transfer_s'] * 1e3:.0f} ms", file=sys.stderr, flush=True)
        for n in [int(x) for x in args.prefill_lengths.split(",") if x]:
            ids = torch.randint(0, 30000, (1, n), generator=torch.Generator().manual_seed(n))
            t1 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            rows.setdefault(n, {"tokens": n})["prefill_s"] = time.perf_counter() - t1
            rows[n]["peak_rss_gib_after_prefill"] = rss_gib()
            del out
            print(f"prefill {n}: {rows[n]['prefill_s']:.1f} s", file=sys.stderr, flush=True)
    result = {"argv": sys.argv[1:], "torch": torch.__version__, "machine": platform.machine(),
              "threads": torch.get_num_threads(), "load_s": load_s, "loadavg": os.getloadavg(),
              "rows": [rows[k] for k in sorted(rows)]}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print("| tokens | 1.5B prefill | transfer (strip + map + re-apply + inject) | prefill / transfer | "
          "transferred cache | peak RSS after transfer / prefill |")
    print("|---:|---:|---:|---:|---:|---|")
    for r in result["rows"]:
        pre = r.get("prefill_s")
        ratio = f"{pre / r['transfer_s']:.0f}x" if pre and r.get("transfer_s") else "not measured"
        print(f"| {r['tokens']:,} | {f'{pre:.1f} s' if pre else 'not measured'} | "
              f"{r['transfer_s'] * 1e3:,.0f} ms | {ratio} | {r['cache_mib']:.0f} MiB | "
              f"{r['peak_rss_gib_after_transfer']:.2f} / {r.get('peak_rss_gib_after_prefill', float('nan')):.2f} GiB |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
