"""The same dense map on the same source numbers held in different memory, one process.

24x2x64 -> 28x2x128, top-k 4, the inputs of ``bench/bench_peer.py``: ``map_tensors`` on the bench's
24 separate ``randn`` tensors per K and V ("raw"), on the RoPE-stripped copies the transfer maps
("stripped", other numbers, the same shapes), on fresh separate copies of the raw tensors, and on
slices of one block holding them (2 MiB pages via ``kvbridge.fit.mapping.fresh``, or plain 4 KiB
pages). One warm-up, then alternating rounds; medians (mins); the copies' outputs compared with
the raw ones' by ``torch.equal``. One thread, CPU clock.

    python bench/bench_map_inputs.py [TOKENS] [ROUNDS]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def state_of(keys, values, spec):
    """``keys`` / ``values`` (one ``[batch, heads, tokens, dim]`` tensor per layer) as the ``KVState`` of
    ``spec`` the benches map: token ids 0, positions ``0..tokens-1`` in every row."""
    from kvbridge.kvstate import KVState

    b, n = keys[0].shape[0], keys[0].shape[2]
    positions = torch.arange(n)[None].expand(b, -1)
    ids = torch.zeros(b, n, dtype=torch.long)
    return KVState(keys=tuple(keys), values=tuple(values), token_ids=ids, positions=positions, spec=spec)


def peer_setup(n: int) -> tuple:
    """``bench_peer.py``'s 24x2x64 -> 28x2x128 inputs at ``n`` tokens on one thread:
    ``(src, tgt, side, mapping, keys, values)``."""
    from bench_peer import Ours, cache_inputs, mapping_inputs, parse_geometry

    torch.set_num_threads(1)
    src, tgt = parse_geometry("24x2x64-28x2x128")
    side = Ours(src, tgt)
    return src, tgt, side, side.mapping(mapping_inputs(src, tgt)), *cache_inputs(src, n)


def one_block(ks, big_pages: bool) -> list:
    from kvbridge.fit.mapping import fresh

    shape = (len(ks),) + tuple(ks[0].shape)
    b = fresh(shape) if big_pages else torch.empty(shape)
    b.copy_(torch.stack(ks))
    return list(b.unbind(0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tokens", nargs="?", type=int, default=8192)
    ap.add_argument("rounds", nargs="?", type=int, default=3)
    args = ap.parse_args()
    n, rounds = args.tokens, args.rounds
    _, _, side, m, keys, values = peer_setup(n)
    st = state_of(keys, values, side.spec_s).strip_rope(dtype=torch.float32)
    sep = [[torch.empty_like(k).copy_(k) for k in ks] for ks in (keys, values)]
    huge = [one_block(ks, True) for ks in (keys, values)]
    small = [one_block(ks, False) for ks in (keys, values)]
    fns = {
        "raw": lambda: m.map_tensors(keys, values),
        "stripped": lambda: m.map_tensors(list(st.keys), list(st.values)),
        "separate copies": lambda: m.map_tensors(*sep),
        "one 2 MiB-page block": lambda: m.map_tensors(*huge),
        "one 4 KiB-page block": lambda: m.map_tensors(*small),
    }
    ref = fns["raw"]()
    same = {}
    for k in ("separate copies", "one 2 MiB-page block", "one 4 KiB-page block"):
        o = fns[k]()
        same[k] = all(torch.equal(a, b) for a, b in zip(ref[0] + ref[1], o[0] + o[1]))
    del ref, o
    load0 = os.getloadavg()[0]
    r = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.process_time()
            x = f()
            r[k].append(time.process_time() - t0)
            del x
    print(f"# {n:,} tokens, 1 thread, CPU clock, {rounds} rounds; load {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    for k, v in r.items():
        eq = "" if k not in same else f"  (bitwise as raw: {same[k]})"
        print(f"- {k}: {1e3 * statistics.median(v):.0f} ({1e3 * min(v):.0f}) ms{eq}")


if __name__ == "__main__":
    main()
