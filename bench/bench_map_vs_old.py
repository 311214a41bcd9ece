"""main's dense map (session 8) against the current one, and the one-``mm`` floor, in one process.

``old_map_dense`` is a copy of ``FittedMapping._map_dense`` as session 8 left it (per block of whole
target layers, all tokens: one stack of the selected source layers into a buffer of up to 32 MiB,
one ``baddbmm``); the current code is ``map_tensors`` (token blocks per target layer). Same inputs as ``bench/bench_peer.py``
(24x2x64 -> 28x2x128, top-k 4, float32); one warm-up, then the floor, the old and the current map
alternately; medians and mins; the outputs compared with ``torch.equal``. One thread: the
process's CPU clock; more (``T=2``): wall clock.

    T=1 [W=1] python bench/bench_map_vs_old.py 2048,8192 [ROUNDS]

``W=1`` adds the current map writing into the same result memory at every call (``work=``): what the
map costs without the first touch of fresh result memory.
"""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch

torch.set_num_threads(int(os.environ.get("T", "1")))
from bench_peer import Ours, cache_inputs, mapping_inputs, parse_geometry, floor_operands
from kvbridge.fit.mapping import fresh, geometry


#: main's blocks of whole target layers: at most this many bytes of gathered features per block
GATHER_BYTES = 32 << 20


def old_map_dense(self, keys, values, dtype=torch.float32):
    """main's ``_map_dense`` (session 8): per block of whole target layers (all tokens) one stack of the
    selected source layers into a buffer of up to GATHER_BYTES, one ``baddbmm`` per block."""
    _, hs, ds = geometry(self.source_spec)
    b, _, t, _ = keys[0].shape
    device = keys[0].device
    ht, dt = self.target_spec.num_kv_heads, self.target_spec.head_dim
    fs, rows = hs * ds, b * t
    groups = self._dense_plan(device)

    def block(k, g):
        return max(1, min(g, GATHER_BYTES // (4 * rows * k * fs)))

    most = max(block(len(sel) // len(ls_), len(ls_)) * (len(sel) // len(ls_)) for ls_, sel, _, _ in groups["k"])
    buf = fresh((rows * most * fs,), device=device)
    out_k = [None] * len(self.layers)
    out_v = [None] * len(self.layers)
    for name, tensors, out in (("k", keys, out_k), ("v", values, out_v)):
        src = [(x if x.dtype == torch.float32 else x.float()).transpose(1, 2) for x in tensors]
        for layers_, sel, w, bias in groups[name]:
            g, k = len(layers_), len(sel) // len(layers_)
            step = block(k, g)
            res = fresh((g, rows, ht * dt), device=device)
            for a in range(0, g, step):
                e = min(g, a + step)
                feats = buf[: rows * (e - a) * k * fs].view(b, t, (e - a) * k, hs, ds)
                torch.stack([src[s] for s in sel[a * k : e * k]], dim=2, out=feats)
                a_ = feats.view(rows, e - a, k * fs).transpose(0, 1)
                torch.baddbmm(bias[a:e], a_, w[a:e], out=res[a:e])
            views = res.view(g, b, t, ht, dt).permute(0, 1, 3, 2, 4)
            for j, layer in enumerate(layers_):
                out[layer] = views[j]
        del src
    return out_k, out_v


toks = [int(x) for x in sys.argv[1].split(",")]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
src_g, tgt_g = parse_geometry("24x2x64-28x2x128")
side = Ours(src_g, tgt_g)
m = side.mapping(mapping_inputs(src_g, tgt_g))
clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter
print(
    f"# main's dense map vs this branch, 24x2x64 -> 28x2x128 top-k 4, {torch.get_num_threads()} thread(s), {'CPU' if clock is time.process_time else 'wall'} clock, {reps} alternating rounds after a warm-up, median (min) ms"
)
print("| tokens | load avg | floor | main map | this map | main / floor | this / floor | main / this | bitwise |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---|")
for n in toks:
    keys, values = cache_inputs(src_g, n)
    x, w, o = floor_operands(src_g, tgt_g, n)
    cands = {
        "floor": lambda: torch.mm(x, w, out=o),
        "main": lambda: old_map_dense(m, keys, values),
        "this": lambda: m.map_tensors(keys, values),
    }
    if os.environ.get("W"):  # W=1: also this map writing into the same result memory each call (work=)
        work = {}
        cands["reused"] = lambda: m.map_tensors(keys, values, work=work)
    a, b = cands["main"](), cands["this"]()
    ok = all(torch.equal(p, q) for p, q in zip(a[0] + a[1], b[0] + b[1]))
    del a, b
    l0 = os.getloadavg()[0]
    res = {k: [] for k in cands}
    for _ in range(reps):
        for k, f in cands.items():
            t0 = clock()
            r = f()
            res[k].append(clock() - t0)
            del r
    md = {k: statistics.median(v) for k, v in res.items()}
    mn = {k: min(v) for k, v in res.items()}
    if "reused" in md:
        print(
            f"  reused results (work=): {1e3 * md['reused']:.0f} ({1e3 * mn['reused']:.0f}) ms, "
            f"{md['reused'] / md['floor']:.2f} (min {mn['reused'] / mn['floor']:.2f}) of the floor"
        )
    print(
        f"| {n:,} | {l0:.1f} -> {os.getloadavg()[0]:.1f} | {1e3 * md['floor']:.0f} ({1e3 * mn['floor']:.0f}) | {1e3 * md['main']:.0f} ({1e3 * mn['main']:.0f}) | {1e3 * md['this']:.0f} ({1e3 * mn['this']:.0f}) | "
        f"{md['main'] / md['floor']:.2f} (min {mn['main'] / mn['floor']:.2f}) | {md['this'] / md['floor']:.2f} (min {mn['this'] / mn['floor']:.2f}) | {md['main'] / md['this']:.2f} | {ok} |",
        flush=True,
    )
