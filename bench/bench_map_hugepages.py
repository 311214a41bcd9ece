"""The dense map with its fresh results advised onto huge pages at any size, against the committed cap.

``bench/bench_peer.py``'s inputs (24x2x64 -> 28x2x128, top-k 4, float32); the one-``mm`` floor and
``map_tensors`` with ``kvbridge.buffers.HUGE_PAGE_MAX`` unbounded (every fresh buffer of 8 MiB or
more ``madvise(MADV_HUGEPAGE)``) or at its committed value, alternating ROUNDS times after a warm-up;
one thread: CPU clock, else wall. Medians (mins) and ratios to the floor. This is the map over the
whole cache, which above 8,192 tokens no command runs (``kvbridge transfer`` maps blocks of 1,024
tokens into reused buffers): for the transfer a user meets, ``bench/bench_map_faults.py --modes
floor,transfer``.

    python bench/bench_map_hugepages.py TOKENS THREADS ROUNDS
"""

import statistics
import sys
import time

import torch
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peer import Ours, cache_inputs, floor_operands, mapping_inputs, parse_geometry
import kvbridge.buffers as mm

torch.set_num_threads(int(sys.argv[2]))
clock = time.process_time if sys.argv[2] == "1" else time.perf_counter
n = int(sys.argv[1])
src, tgt = parse_geometry("24x2x64-28x2x128")
side = Ours(src, tgt)
m = side.mapping(mapping_inputs(src, tgt))
keys, values = cache_inputs(src, n)
x, w, out = floor_operands(src, tgt, n)


def var(maxb):
    def f():
        mm.HUGE_PAGE_MAX = maxb
        return m.map_tensors(keys, values)

    return f


fns = {
    "floor": lambda: torch.mm(x, w, out=out),
    "advised at any size": var(1 << 62),
    "advised up to HUGE_PAGE_MAX (committed)": var(mm.HUGE_PAGE_MAX),
}
for f in fns.values():
    f()
r = {k: [] for k in fns}
for _ in range(int(sys.argv[3])):
    for k, f in fns.items():
        t0 = clock()
        o = f()
        r[k].append(clock() - t0)
        del o
fl, flm = statistics.median(r["floor"]), min(r["floor"])
for k, v in r.items():
    print(
        f"{k}: {statistics.median(v) * 1e3:,.0f} ({min(v) * 1e3:,.0f}) ms, / floor {statistics.median(v) / fl:.2f} (min {min(v) / flm:.2f})",
        flush=True,
    )
