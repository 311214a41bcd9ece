"""What a long transfer holds in memory, step by step, and the token-block transfer against the one pass.

The transfer of ``bench/bench_pair_speed.py`` (strip the source RoPE, map, re-apply the target's RoPE)
without the models: the mapping of a fit folder (``--mapping``, e.g. the real Qwen2.5-Coder 0.5B ->
1.5B ridge map; only its ~15 MiB of weights are loaded) or, without one, a random dense mapping of
that pair's geometry (24x2x64 -> 28x2x128, top-k 4, Qwen2 RoPE); the source cache is
``bench_fit.random_state`` (float32, RoPE applied), as in ``bench_pair_speed.py``. Each mode runs in
its own child process, alternating, ``--rounds`` times:

- ``one-pass``: ``transfer`` as one pass over the whole cache (``CHUNK_TOKENS`` raised past the
  length), plus its steps one by one (strip, map, re-apply), each step's own resident peak
  (``VmHWM`` reset before it, Linux) above the process with the source cache loaded;
- ``blocks``: ``transfer`` as it runs by default (token blocks of ``kvbridge.transfer.CHUNK_TOKENS``).

Per mode: the transfer's resident peak above the source cache, wall and CPU time (median / min of
``--repeats`` in the child after one warm-up), and a sha256 of every output K/V, which must be the same
for both modes (bitwise equal results).

    python bench/bench_transfer_memory.py [--mapping DIR] [--tokens 32768] [--threads 2] [--rounds 2] [--live]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GIB = 2**30


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field + ":"))


def _reset() -> int:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _status("VmRSS")


def _mapping(path):
    if path:
        from kvbridge.fit.artifact import load_mapping
        from kvbridge.plugins import get_host

        return load_mapping(path, host=get_host())
    from bench_peer import Ours, mapping_inputs, parse_geometry

    src, tgt = parse_geometry("24x2x64-28x2x128")
    return Ours(src, tgt).mapping(mapping_inputs(src, tgt))


def digest(state) -> str:
    h = hashlib.sha256()
    for t in (*state.keys, *state.values):
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def child(args) -> dict:
    import torch

    from kvbridge import transfer as transfer_mod

    torch.set_num_threads(args.threads)
    from bench_fit import random_state

    mapping = _mapping(args.mapping)
    state = random_state(mapping.source_spec, args.tokens)
    if args.mode == "one-pass":
        transfer_mod.CHUNK_TOKENS = 1 << 62
    run = lambda: transfer_mod.transfer(state, mapping)  # noqa: E731
    out = run()  # warm-up (tables, plans, libraries)
    row = {"mode": args.mode, "digest": digest(out), "cache_gib": state.nbytes() / GIB}
    del out
    gc.collect()
    base = _reset()
    out = run()
    row["peak_gib"] = (_status("VmHWM") - base) / GIB
    row["output_gib"] = out.nbytes() / GIB
    del out
    gc.collect()
    wall, cpu = [], []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = run()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        del out
    row["wall_s"] = (statistics.median(wall), min(wall))
    row["cpu_s"] = (statistics.median(cpu), min(cpu))
    if args.mode == "one-pass":  # the steps one by one, each one's own peak above the source cache
        from kvbridge.transfer import work_dtype

        gc.collect()
        base = _reset()
        content = state.strip_rope(dtype=work_dtype(state.dtype))
        row["strip_peak_gib"] = (_status("VmHWM") - base) / GIB
        _reset()
        mapped = mapping.map_content(content, mapping.target_spec)
        row["map_peak_gib"] = (_status("VmHWM") - base) / GIB
        del content
        gc.collect()
        _reset()
        applied = mapped.apply_rope(mapped.positions, spec=mapping.target_spec, dtype=torch.float32)
        row["apply_peak_gib"] = (_status("VmHWM") - base) / GIB
        row["mapped_gib"] = mapped.nbytes() / GIB
        del mapped, applied
    row["loadavg"] = os.getloadavg()
    row["threads"] = torch.get_num_threads()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mapping", default=None, help="a kvbridge fit folder (default: a random map of the pair's shape)")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--live",
        action="store_true",
        help="children with glibc's mmap threshold fixed at 64 KiB (MALLOC_MMAP_THRESHOLD_), so freed tensors "
        "leave the resident set and each step's peak is what it holds live (default: the allocator as it is)",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--mode", choices=("one-pass", "blocks"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(child(args)))
        return
    rows: dict = {"one-pass": [], "blocks": []}
    print(f"# load average before: {' / '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
    for _ in range(args.rounds):
        for mode in rows:
            cmd = [sys.executable, __file__, "--mode", mode, "--tokens", str(args.tokens)]
            cmd += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
            cmd += ["--mapping", args.mapping] if args.mapping else []
            env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536") if args.live else None
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode:
                raise SystemExit(f"{mode} child failed: {out.stderr[-600:]}")
            rows[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[mode][-1]), flush=True)
    digests = {r["digest"] for rs in rows.values() for r in rs}
    print(
        f"\n{args.tokens:,} tokens, {args.threads} thread(s), mapping {args.mapping or 'random, the pair shape'}, "
        f"{'mmap threshold 64 KiB (--live)' if args.live else 'default malloc'}; load average after: "
        f"{' / '.join(f'{v:.1f}' for v in os.getloadavg())}"
    )
    print(f"bitwise equal outputs in every child: {len(digests) == 1} ({', '.join(sorted(digests))})\n")
    print("| transfer | peak above the source cache GiB (per child) | wall s median (min) | CPU s median (min) |")
    print("|---|---|---:|---:|")
    for mode, rs in rows.items():
        wall = [r["wall_s"][0] for r in rs]
        cpu = [r["cpu_s"][0] for r in rs]
        peaks = ", ".join(f"{r['peak_gib']:.2f}" for r in rs)
        print(
            f"| {mode} | {peaks} | {statistics.median(wall):.2f} "
            f"({min(r['wall_s'][1] for r in rs):.2f}) | {statistics.median(cpu):.2f} ({min(r['cpu_s'][1] for r in rs):.2f}) |"
        )
    r = rows["one-pass"][0]
    print(
        f"\none pass, each step's own peak above the source cache ({r['cache_gib']:.2f} GiB): strip "
        f"{r['strip_peak_gib']:.2f}, map {r['map_peak_gib']:.2f} (with the stripped copy alive), re-apply "
        f"{r['apply_peak_gib']:.2f} GiB (the mapped K/V {r['mapped_gib']:.2f} GiB alive); output {r['output_gib']:.2f} GiB"
    )
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
