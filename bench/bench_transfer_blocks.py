"""The transfer in one pass against token blocks of several sizes, and the one-``mm`` floor, in one process.

``bench/bench_peer.py``'s inputs (24x2x64 -> 28x2x128, top-k 4, float32, RoPE applied); the floor
(ONE ``torch.mm`` of the mapping's FLOPs into a warm output), ``transfer`` in one pass
(``CHUNK_TOKENS`` past the length) and in blocks of each size (``BLOCKS_ABOVE`` = 0), alternately,
``ROUNDS`` times after a warm-up; one thread, the process's CPU clock; medians (mins) and ratios to
the floor.

    python bench/bench_transfer_blocks.py TOKENS [ROUNDS] [SIZES, default 512,1024,2048]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch

from bench_map_inputs import peer_setup, state_of
from bench_peer import floor_operands
from kvbridge import transfer as tm

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("tokens", type=int)
ap.add_argument("rounds", nargs="?", type=int, default=3)
ap.add_argument("sizes", nargs="?", default="512,1024,2048")
args = ap.parse_args()
n, rounds, sizes = args.tokens, args.rounds, [int(s) for s in args.sizes.split(",")]
src, tgt, side, m, keys, values = peer_setup(n)
st = state_of(keys, values, side.spec_s)
x, w, out = floor_operands(src, tgt, n)


def tr(size):
    def f():
        tm.CHUNK_TOKENS, tm.BLOCKS_ABOVE = size, 0
        return tm.transfer(st, m, side.spec_t)

    return f


fns = {"floor": lambda: torch.mm(x, w, out=out), "one pass": tr(1 << 40)}
fns.update({f"blocks of {s:,}": tr(s) for s in sizes})
for f in fns.values():
    f()
r = {k: [] for k in fns}
import os  # noqa: E402

l0 = os.getloadavg()[0]
for _ in range(rounds):
    for k, f in fns.items():
        t0 = time.process_time()
        o = f()
        r[k].append(time.process_time() - t0)
        del o
fl, flm = statistics.median(r["floor"]), min(r["floor"])
print(
    f"# transfer, {n:,} tokens, 1 thread, CPU clock, {rounds} rounds; load average {l0:.1f} -> {os.getloadavg()[0]:.1f}"
)
print("| transfer | ms median (min) | / floor (min) |\n|---|---:|---:|")
for k, v in r.items():
    print(
        f"| {k} | {statistics.median(v) * 1e3:,.0f} ({min(v) * 1e3:,.0f}) | {statistics.median(v) / fl:.2f} ({min(v) / flm:.2f}) |"
    )
