"""Fit memory against the plan: a ridge fit's peak RSS above the loaded models (``VmHWM`` after
``clear_refs``, once both models are loaded and the token ids exist) next to what ``kvbridge fit
--plan`` gives for the same settings: the statistics bytes, and the fit memory (statistics +
float64 workspace + one calibration batch). Each fit in a fresh process (``--repeat`` of them,
medians), no ``--memory`` (the default budget) unless ``--memory`` is given.

``--steps``: one process per pair, printing where the peak goes: RSS before and after each step
of the fit (each model's forward and cache, the sampled features of a batch, the statistics
update, the layer selection, the solves, the save) and the peak so far, in MiB above the start.

``--warm``: the measured fit is the second one in its process (first-use imports and the
allocator's first arenas excluded). ``--trim``: the child runs with glibc told to return freed
memory (``MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0``), so the peak is the fit's
live memory rather than what the allocator kept from freed buffers: an instrument, not a setting.

    python bench/bench_fit_memory.py [--pairs zoo:base/zoo:stranger,qwen2.5-coder-0.5b/qwen2.5-coder-1.5b]
        [--tokens 2048] [--stride 2] [--top-k 2] [--batch-size 4] [--dtype float32] [--memory GIB]
        [--threads 1] [--repeat 3] [--warm] [--trim] [--steps] [--src OTHER_TREE/src]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_real import _peak_kib, _reset_peak, _rss_kib  # noqa: E402


def child(args) -> None:
    import torch

    from kvbridge.fit import fit
    from kvbridge.models import load

    torch.set_num_threads(args.threads)
    src_ref, tgt_ref = args.child.split("/")
    src = load(src_ref, dtype=args.dtype).model
    tgt = src if tgt_ref == src_ref else load(tgt_ref, dtype=args.dtype).model
    ids = torch.randint(10, src.config.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(1))
    kw = {} if args.memory is None else {"memory_budget": int(args.memory * 2**30)}

    def run(tokens):
        with tempfile.TemporaryDirectory(prefix="kvbridge-fitmem-") as tmp:
            return fit(
                src,
                tgt,
                tokens,
                seq_len=args.seq_len,
                stride=args.stride,
                batch_size=args.batch_size,
                out=str(Path(tmp) / "map"),
                overwrite=True,
                distributed=None,
                top_k=args.top_k,
                **kw,
            )

    log = []
    if args.steps:
        _watch_steps(log)
    if args.warm:  # one fit first, so the measured one excludes first-use imports and allocator warm-up
        run(ids)
    log.clear()
    base = _rss_kib()
    log.append(base)
    _reset_peak()
    t0 = time.process_time()
    mapping = run(ids)
    cpu = time.process_time() - t0
    if args.steps:
        print("| step | RSS before MiB | RSS after MiB | peak so far MiB |\n|---|---:|---:|---:|")
        for name, before, after, peak in log[1:]:
            print(
                f"| {name} | {(before - base) / 1024:.1f} | {(after - base) / 1024:.1f} | {(peak - base) / 1024:.1f} |"
            )
    report = mapping.report
    passes = report.passes if hasattr(report, "passes") else report.get("passes")
    print(
        "RESULT "
        + json.dumps(
            {"peak_above_models": (_peak_kib() - base) * 1024, "cpu_s": cpu, "passes": passes, "base": base * 1024}
        )
    )


def _watch_steps(log: list) -> None:
    """Wrap the fit's steps so each appends ``(name, RSS before, RSS after, peak so far)`` (KiB) to ``log``."""
    from kvbridge.fit import artifact, ridge, select
    from kvbridge.fit.calibrate import PairedCalibration
    from kvbridge.fit.stats import LayerStats

    def watch(name, fn):
        def wrapped(*a, **k):
            before = _rss_kib()
            out = fn(*a, **k)
            if log:
                label = name(a) if callable(name) else name
                log.append((label, before, _rss_kib(), _peak_kib()))
            return out

        return wrapped

    def model_step(a):
        cal, model = a[0], a[1]
        return f"{'source' if model is cal.source_model else 'target'} forward + cache + RoPE stripped"

    PairedCalibration._content = watch(model_step, PairedCalibration._content)
    PairedCalibration._sampled = staticmethod(watch("kept positions sampled (float32)", PairedCalibration._sampled))
    LayerStats.update = watch("statistics update (float64 workspace)", LayerStats.update)
    select.single_layer_r2 = watch("layer selection (single-layer R²)", select.single_layer_r2)
    ridge.RidgeFitter._solve_layers = staticmethod(watch("solves", ridge.RidgeFitter._solve_layers))
    artifact.save_mapping = watch("save", artifact.save_mapping)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="zoo:base/zoo:stranger")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--stride", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per pair (medians)")
    ap.add_argument("--src", default=None, help="PYTHONPATH of the children (another tree's src/, e.g. main's)")
    ap.add_argument("--steps", action="store_true", help="print where the peak goes, step by step (one process)")
    ap.add_argument("--trim", action="store_true", help="children run with glibc returning freed memory")
    ap.add_argument("--memory", type=float, default=None, help="statistics budget in GiB (default: none given)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warm", action="store_true", help="measure a second fit in the same process")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    from kvbridge.fit.plan import plan

    print(
        f"# bench_fit_memory: ridge, top-k {args.top_k}, seq-len {args.seq_len}, stride {args.stride}, batch "
        f"{args.batch_size}, {args.tokens:,} tokens, {args.dtype}, --memory {args.memory or 'not given'}, "
        f"{args.threads} thread(s), {'second fit in the process' if args.warm else 'first fit in a fresh process'}"
        f"{', allocator returning freed memory (--trim)' if args.trim else ''}"
        f"{f', fits by {args.src}' if args.src else ''}, medians of {args.repeat} "
        f"processes; load average {' / '.join(f'{v:.1f}' for v in os.getloadavg())}\n"
    )
    print(
        "| pair | passes | fit s (CPU) | planned statistics MiB | planned fit memory MiB (+ workspace + batch) "
        "| peak above the models MiB (runs) | peak / planned statistics | peak / planned fit memory |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    env = dict(os.environ)
    if args.trim:
        env.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    if args.src:
        env["PYTHONPATH"] = args.src
    for pair in args.pairs.split(","):
        s, t = pair.split("/")
        cmd = (
            [sys.executable, __file__, "--child", pair]
            + [
                f"--{k.replace('_', '-')}={v}"
                for k, v in vars(args).items()
                if k in ("tokens", "seq_len", "stride", "top_k", "threads", "batch_size", "dtype")
                or (k == "memory" and v is not None)
            ]
            + (["--warm"] if args.warm else [])
            + (["--steps"] if args.steps else [])
        )
        runs, steps = [], []
        for _ in range(args.repeat):
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if out.returncode or line is None:
                raise SystemExit(f"{pair}: child failed: {out.stderr[-1500:]}")
            runs.append(json.loads(line[len("RESULT ") :]))
            if args.steps:
                steps.append("\n".join(ln for ln in out.stdout.splitlines() if ln.startswith("|")))
        kw = {} if args.memory is None else {"memory_budget": int(args.memory * 2**30)}
        p = plan(
            s,
            t,
            tokens=args.tokens,
            seq_len=args.seq_len,
            stride=args.stride,
            top_k=args.top_k,
            batch_size=args.batch_size,
            dtype=args.dtype,
            **kw,
        )
        peaks = sorted(r["peak_above_models"] for r in runs)
        peak = statistics.median(peaks)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        print(
            f"| {s} -> {t} | {len(runs[0]['passes'] or [])} | {cpu:.1f} | {p.statistics_bytes / 2**20:,.1f} | "
            f"{p.fit_bytes / 2**20:,.1f} | {peak / 2**20:,.1f} ({', '.join(f'{x / 2**20:,.1f}' for x in peaks)}) | "
            f"{peak / p.statistics_bytes:.2f} | {peak / p.fit_bytes:.2f} |",
            flush=True,
        )
        for i, text in enumerate(steps):
            print(f"\nsteps of {s} -> {t}, process {i + 1} (MiB above the loaded models):\n\n{text}")


if __name__ == "__main__":
    main()
