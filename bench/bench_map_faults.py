"""The dense map's time and minor page faults with fresh results against results reused (``work=``).

``bench/bench_peer.py``'s inputs (24x2x64 -> 28x2x128, top-k 4, float32). Each child process times
``--repeats`` calls (after one warm-up) of one mode: ``fresh`` (``map_tensors(keys, values)``: new
results every call, what ``kvbridge transfer`` up to 8,192 tokens meets), ``warm`` (the same with a
``work`` dict kept between calls: the results' memory is touched once) or ``transfer`` (the whole
``kvbridge.transfer.transfer``; above 8,192 tokens in blocks, what ``kvbridge transfer`` meets) or
``floor`` (``bench_peer.py``'s one ``mm`` of the same FLOPs into a warm output), or the one-pass
transfer's two other stages alone, ``strip`` (the source keys' RoPE stripped to float32) and
``apply`` (the mapped content's keys rotated for the target), or ``blocks`` (the transfer forced onto
its token-block path, ``BLOCKS_ABOVE`` = 0, at any length over one block), or ``steps`` (the
one-pass transfer's strip, map and apply in its order, each stage's wall time and faults printed
under the table), or ``split`` (the token-block transfer, ``_transfer_blocks``' body at any length
over one block, each block's strip, map, apply, the output's allocation and the copies into it
timed, wall and faults, summed over the blocks and printed under the table with the first block's
share; ``splitpop``: the same with the output populated, ``buffers.populate``, when allocated;
``splitwarm``: with the previous call's output written again, its pages touched: what the copies
cost without their first touch); ``MODE@TOKENS``: ``blocks`` or a ``split`` mode at that block
size), each call's wall time, CPU time and minor page faults
(``resource.getrusage(RUSAGE_SELF).ru_minflt`` before / after); the previous call's output is
dropped before the next. Children alternate (the order reversed every round); ``--trees`` runs the
same modes under other source trees (``NAME=PATH`` to a ``src`` folder, as ``PYTHONPATH``) so two
versions of the map alternate too, and every child prints the sha256 of its last output (bitwise
comparison across trees). Medians of the children's medians, and their spread. ``--repeats 0`` times
each child's first call instead (no warm-up: a command that runs one transfer per process).

    python bench/bench_map_faults.py --tokens 2048,8192 --threads 2 --rounds 4 --repeats 5
    python bench/bench_map_faults.py --trees base=/tmp/base/src,this=src --modes fresh ...
    python bench/bench_map_faults.py --digest 1 > this-1.txt   # sha256 of map and transfer outputs
    python bench/bench_map_faults.py --tokens 2048 --modes steps --rounds 6 --detail   # each child
    python bench/bench_map_faults.py --tokens 9000 --modes blocks,split --threads 1 --repeats 0   # first calls
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def thread_busy() -> dict:
    """Each of this process's threads' time on a CPU so far, ns, by ``(tid, name)``
    (``/proc/self/task/*/schedstat`` and ``comm``: kvbridge's pools name theirs); {} elsewhere."""
    out = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/schedstat") as fh, open(f"/proc/self/task/{tid}/comm") as fc:
                out[tid, fc.read().strip()] = int(fh.read().split()[0])
    except OSError:
        return {}
    return out


#: system-wide ``/proc/vmstat`` counters taken around each call (huge-page faults, compaction)
VMSTAT = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall", "compact_migrate_scanned", "pgfault")


def vmstat() -> dict:
    """:data:`VMSTAT`'s counters, and the machine's ``steal`` time in ms (``/proc/stat``: time the
    hypervisor ran something else on this machine's CPUs); {} elsewhere."""
    try:
        with open("/proc/vmstat") as fh:
            rows = dict(line.split() for line in fh)
        with open("/proc/stat") as fh:
            cpu = fh.readline().split()
    except OSError:
        return {}
    out = {k: int(rows[k]) for k in VMSTAT if k in rows}
    if len(cpu) > 8:
        out["steal_ms"] = int(cpu[8]) * 1000 // os.sysconf("SC_CLK_TCK")
    return out


#: the block path's stages ``split`` times: a block's strip, map, apply, the output's allocation (first block), copies
SPLIT_STAGES = ("strip", "map", "apply", "alloc", "copy")


def child(mode: str, tokens: int, threads: int, repeats: int, chunk: int = 0) -> dict:
    import torch

    mode, _, block = mode.partition("@")  # blocks@4096, split@4096: that block size
    chunk = int(block) if block else chunk
    torch.set_num_threads(threads)
    sys.path.insert(0, str(HERE))
    from bench_peer import Ours, cache_inputs, floor_operands, mapping_inputs, parse_geometry

    src, tgt = parse_geometry("24x2x64-28x2x128")
    side = Ours(src, tgt)
    inputs = mapping_inputs(src, tgt)
    keys, values = cache_inputs(src, tokens)
    do_map, do_transfer = side.map_calls(inputs, keys, values)
    m = side.mapping(inputs)
    work: dict = {}
    x, w, o = floor_operands(src, tgt, tokens) if mode == "floor" else (None, None, None)
    stages: list = []  # steps: per call [(wall, faults)] of strip, map, apply

    def steps():  # the one-pass transfer's three stages in its order, each timed (transfer.transfer's body)
        row = []
        for i in range(3):
            f0, w0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            if i == 0:
                c = state.strip_rope(dtype=torch.float32)
            elif i == 1:
                mp = m.map_content(c, side.spec_t)
                del c
            else:
                out = mp.apply_rope(state.positions, spec=side.spec_t, dtype=torch.float32)
                del mp
            row.append((time.perf_counter() - w0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0))
        stages.append(row)
        return parts(out)

    kept: list = []  # splitwarm: the output kept from the previous call (its pages touched)
    split: list = []  # split: per call {stage: [wall, faults]} summed over the blocks, and each block's wall

    def split_blocks():  # transfer._transfer_blocks' body, each stage of each block timed (same calls, same order)
        from kvbridge.buffers import fresh, populate, token_blocks

        pos = torch.as_tensor(state.positions).expand(state.batch_size, -1)
        sums = {k: [0.0, 0] for k in SPLIT_STAGES}
        per_block = []
        clock = resource.getrusage, resource.RUSAGE_SELF, time.perf_counter

        def tick():
            return clock[0](clock[1]).ru_minflt, clock[2]()

        def tock(stage, t0):
            f1, w1 = tick()
            sums[stage][0] += w1 - t0[1]
            sums[stage][1] += f1 - t0[0]
            return f1, w1

        n, wk, out_k, out_v = state.num_tokens, {}, [], []
        if kept:  # splitwarm: the last call's output again, every page already touched
            out_k, out_v = kept
        for a, e in token_blocks(n, tr.CHUNK_TOKENS):
            b0 = t = tick()
            content = state.slice_tokens(a, e).strip_rope(dtype=torch.float32)
            t = tock("strip", t)
            mapped = m.map_content(content, side.spec_t, work=wk)
            del content
            t = tock("map", t)
            part = mapped.apply_rope(pos[:, a:e], spec=side.spec_t, dtype=torch.float32)
            del mapped
            t = tock("apply", t)
            if not out_k:
                for ts, o in ((part.keys, out_k), (part.values, out_v)):
                    o.extend(fresh((*x.shape[:2], n, *x.shape[3:]), dtype=x.dtype, device=x.device) for x in ts)
                if mode == "splitpop":
                    for o in out_k + out_v:
                        populate(o)
                t = tock("alloc", t)
                if mode == "splitwarm":
                    kept[:] = [out_k, out_v]
            for ts, o in ((part.keys, out_k), (part.values, out_v)):
                for dst, x in zip(o, ts):
                    dst[:, :, a:e].copy_(x)
            del part
            t = tock("copy", t)
            per_block.append(t[1] - b0[1])
        split.append({"stages": sums, "blocks": per_block})
        return out_k, out_v

    if mode in ("strip", "apply", "blocks", "steps", "split", "splitpop", "splitwarm"):
        from bench_map_inputs import state_of

        from kvbridge import transfer as tr

        state = state_of(keys, values, side.spec_s)
        # the split modes strip nothing beforehand: with --repeats 0 their call is the process's first
        content = None if mode.startswith("split") else state.strip_rope(dtype=torch.float32)
        mapped = m.map_content(content, side.spec_t) if mode == "apply" else None
        tr.BLOCKS_ABOVE = 0 if mode == "blocks" else tr.BLOCKS_ABOVE  # the token-block path at any length
        tr.CHUNK_TOKENS = chunk or tr.CHUNK_TOKENS

    def parts(s):
        return list(s.keys), list(s.values)

    fn = {
        "floor": lambda: ([torch.mm(x, w, out=o)], []),
        "fresh": do_map,
        "warm": lambda: m.map_tensors(keys, values, work=work),
        "transfer": do_transfer,
        "blocks": do_transfer,
        "steps": steps,
        "split": split_blocks,
        "splitpop": split_blocks,
        "splitwarm": split_blocks,
        "strip": lambda: parts(state.strip_rope(dtype=torch.float32)),  # the one-pass transfer's stages
        "apply": lambda: parts(mapped.apply_rope(state.positions, spec=side.spec_t, dtype=torch.float32)),
    }[mode]
    walls, cpus, faults, busy, switches, named, vms = [], [], [], [], [], [], []
    out = None if repeats == 0 else fn()  # warm-up (the warm mode touches its results here); 0: time the first call
    for _ in range(max(1, repeats)):
        del out
        u0, b0, v0 = resource.getrusage(resource.RUSAGE_SELF), thread_busy(), vmstat()
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        u1, b1, v1 = resource.getrusage(resource.RUSAGE_SELF), thread_busy(), vmstat()
        faults.append(u1.ru_minflt - u0.ru_minflt)
        switches.append(u1.ru_nivcsw - u0.ru_nivcsw)  # involuntary: a thread preempted (the core wanted elsewhere)
        busy.append(sorted(((b1[t] - b0.get(t, 0)) / 1e9 for t in b1), reverse=True)[:3])
        py = {str(t.native_id): t.name.split("_")[0] for t in threading.enumerate()}  # kvbridge's pools name theirs
        by_name: dict = {}  # the main thread, kvbridge's pools' threads, the rest (torch's OpenMP workers)
        for (tid, comm), ns in b1.items():
            key = py.get(tid, "other")
            by_name[key] = by_name.get(key, 0.0) + (ns - b0.get((tid, comm), 0)) / 1e9
        named.append(by_name)
        vms.append({k: v1[k] - v0[k] for k in v1})
    return {
        "walls": walls,
        "calls": [  # each timed call: the machine's steal time and the threads' CPU time by name, ms
            {"steal": v.get("steal_ms", 0), **{k: round(1e3 * t, 1) for k, t in d.items()}} for v, d in zip(vms, named)
        ],
        "busy": [statistics.median(b[j] if len(b) > j else 0.0 for b in busy) for j in range(3)],
        "named": {k: statistics.median(d.get(k, 0.0) for d in named) for k in sorted(set().union(*named))},
        "vmstat": {k: statistics.median(d.get(k, 0) for d in vms) for k in sorted(set().union(*vms))},
        "preempted": statistics.median(switches),
        "wall": statistics.median(walls),
        "cpu": statistics.median(cpus),
        "faults": statistics.median(faults),
        "sha": digest(out[0] + out[1]),
        "stages": [[statistics.median(r[i][j] for r in stages[-len(walls) :]) for j in (0, 1)] for i in range(3)]
        if stages
        else None,
        **({"split": split_summary(split[-len(walls) :])} if split else {}),
    }


def split_summary(calls: list) -> dict:
    """``split``'s calls -> medians: each stage's wall s and faults summed over the blocks, the first block's
    wall, the other blocks' median wall and their count."""
    return {
        "stages": {k: [statistics.median(c["stages"][k][j] for c in calls) for j in (0, 1)] for k in SPLIT_STAGES},
        "first": statistics.median(c["blocks"][0] for c in calls),
        "rest": statistics.median(statistics.median(c["blocks"][1:] or [0.0]) for c in calls),
        "count": len(calls[0]["blocks"]),
    }


#: (batch, tokens, dtype) of the bitwise check (session 10's list, BENCHMARKS.md "Issue 35: 32,768 tokens")
DIGEST_SHAPES = [(1, 1, "float32"), (1, 3, "float32"), (2, 3, "float32"), (1, 100, "float32")]
DIGEST_SHAPES += [(2, 513, "float16"), (1, 2048, "float32"), (1, 2049, "float32"), (2, 3000, "float32")]
DIGEST_SHAPES += [(1, 5000, "float16"), (1, 8192, "float32"), (1, 12000, "float32"), (2, 9000, "float16")]


def digests(threads: int) -> None:
    """One line per shape: sha256 of the map's outputs (fresh and with ``work``) and of the transfer's."""
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(HERE))
    from bench_map_inputs import state_of
    from bench_peer import Ours, mapping_inputs, parse_geometry

    from kvbridge.transfer import transfer

    src, tgt = parse_geometry("24x2x64-28x2x128")
    side = Ours(src, tgt)
    m = side.mapping(mapping_inputs(src, tgt))
    for b, n, dt in DIGEST_SHAPES:
        g = torch.Generator().manual_seed(n)
        dtype = getattr(torch, dt)
        shape = (b, src[1], n, src[2])
        keys = [torch.randn(shape, generator=g).to(dtype) for _ in range(src[0])]
        values = [torch.randn(shape, generator=g).to(dtype) for _ in range(src[0])]
        k, v = m.map_tensors(keys, values, dtype=dtype)
        work: dict = {}
        m.map_tensors(keys[::-1], values[::-1], dtype=dtype, work=work)  # a first call to overwrite
        kw, vw = m.map_tensors(keys, values, dtype=dtype, work=work)
        state = state_of(keys, values, side.spec_s)
        out = transfer(state, m, side.spec_t)
        print(
            f"{b} {n} {dt} map {digest(k + v)} work {digest(kw + vw)} "
            f"transfer {digest(list(out.keys) + list(out.values))}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per child after a warm-up; 0: the first call")
    ap.add_argument("--modes", default="fresh,warm")
    ap.add_argument("--trees", default="", help="NAME=SRC,...: run each mode under these source trees")
    ap.add_argument("--digest", type=int, default=0, help="THREADS: print the bitwise-check digests and exit")
    ap.add_argument(
        "--detail",
        action="store_true",
        help="also print each child: wall, its three busiest threads' CPU time and preemptions per call, stages",
    )
    ap.add_argument(
        "--chunk", type=int, default=0, help="TOKENS: the block size of blocks / split (default CHUNK_TOKENS)"
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.digest:
        digests(args.digest)
        return
    if args.child:
        print(json.dumps(child(args.child, int(args.tokens), args.threads, args.repeats, args.chunk)))
        return
    trees = [tuple(s.split("=", 1)) for s in args.trees.split(",") if s] or [("this", os.environ.get("PYTHONPATH", ""))]
    runs = [(name, path, mode) for name, path in trees for mode in args.modes.split(",")]
    load0 = os.getloadavg()
    print(
        f"# bench_map_faults: 24x2x64 -> 28x2x128, top-k 4, float32, {args.threads} thread(s), "
        f"{args.rounds} rounds x {args.repeats} calls per child; load {load0[0]:.2f}"
    )
    print("| tokens | tree | mode | wall ms | CPU ms | minor faults per call | children's wall medians | sha256 |")
    print("|---:|---|---|---:|---:|---:|---|---|")
    for n in [int(t) for t in args.tokens.split(",")]:
        res: dict = {r: [] for r in runs}
        for i in range(args.rounds):
            for name, path, mode in runs if i % 2 == 0 else runs[::-1]:
                env = dict(os.environ, PYTHONPATH=path)
                cmd = [sys.executable, __file__, "--child", mode, "--tokens", str(n), "--threads", str(args.threads)]
                cmd += ["--repeats", str(args.repeats)] + (["--chunk", str(args.chunk)] if args.chunk else [])
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
                res[(name, path, mode)].append(json.loads(out.strip().splitlines()[-1]))
        for (name, path, mode), rs in res.items():
            shas = sorted({r["sha"] for r in rs})
            print(
                f"| {n:,} | {name} | {mode} | {1e3 * statistics.median(r['wall'] for r in rs):,.1f} | "
                f"{1e3 * statistics.median(r['cpu'] for r in rs):,.1f} | "
                f"{statistics.median(r['faults'] for r in rs):,.0f} | "
                + ", ".join(f"{1e3 * r['wall']:,.0f}" for r in rs)
                + f" | {' '.join(shas)} |",
                flush=True,
            )
            if rs[0].get("stages"):  # steps: the stage medians (wall ms, faults) of the children
                st = [[statistics.median(r["stages"][i][j] for r in rs) for j in (0, 1)] for i in range(3)]
                print(
                    f"#   {n:,} {name} steps: "
                    + ", ".join(
                        f"{k} {1e3 * w:,.1f} ms ({f:,.0f} faults)" for k, (w, f) in zip(("strip", "map", "apply"), st)
                    )
                )
            if rs[0].get("split"):  # split: the block path's stage medians of the children, summed over the blocks
                sp = [r["split"] for r in rs]
                st = {k: [statistics.median(x["stages"][k][j] for x in sp) for j in (0, 1)] for k in SPLIT_STAGES}
                print(
                    f"#   {n:,} {name} {mode} ({sp[0]['count']} blocks): "
                    + " + ".join(f"{k} {1e3 * w:,.1f} ms ({f:,.0f} faults)" for k, (w, f) in st.items())
                    + f" = {1e3 * sum(w for w, _ in st.values()):,.1f} ms; first block "
                    + f"{1e3 * statistics.median(x['first'] for x in sp):,.1f} ms, the others' median "
                    + f"{1e3 * statistics.median(x['rest'] for x in sp):,.1f} ms",
                    flush=True,
                )
            for r in rs if args.detail else ():  # each child in the order it ran
                st = r.get("stages") or []
                print(
                    f"#   {n:,} {name} {mode} child: wall {1e3 * r['wall']:,.1f} ms ("
                    + ", ".join(f"{1e3 * w:,.0f}" for w in r["walls"])
                    + "; per call steal ms / CPU ms by thread: "
                    + "; ".join(" ".join(f"{k} {v:,.0f}" for k, v in c.items()) for c in r["calls"])
                    + "), its busiest threads "
                    + " / ".join(f"{1e3 * b:,.0f}" for b in r["busy"])
                    + " ms on a CPU (by name: "
                    + ", ".join(f"{k} {1e3 * v:,.0f}" for k, v in r["named"].items())
                    + f"), preempted {r['preempted']:,.0f} times; vmstat "
                    + ", ".join(f"{k} +{v:,.0f}" for k, v in r["vmstat"].items())
                    + "".join(
                        f", {k} {1e3 * w:,.1f} ms ({f:,.0f} faults)" for k, (w, f) in zip(("strip", "map", "apply"), st)
                    )
                    + "".join(
                        f", {k} {1e3 * w:,.1f} ms ({f:,.0f} faults)"
                        for k, (w, f) in (r.get("split") or {}).get("stages", {}).items()
                    )
                )
    print(f"# load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
