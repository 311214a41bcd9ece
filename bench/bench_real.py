"""Real model (SmolLM2-135M-Instruct, the GGUF dequantized to float32): transfer and pack restore vs
the target's own prefill, identity-transfer overhead per token, fit throughput and memory, and the
resource planner's estimates against what the fit measured.

1. at 512 / 2,048 / 8,192 tokens: the model's own prefill (``logits_to_keep=1``), the identity
   transfer through the full path (extracted cache -> strip RoPE -> identity map -> apply RoPE)
   and a prefix-pack restore (read + sha256 + checks + cache, zero forwards; the model's weights
   fingerprint computed once beforehand, as a process holding the model would); the next-token
   logits from the transferred / restored caches against the prefill's own;
2. fit throughput: ``kvbridge.fit.fit(smollm2, smollm2)`` on random token ids, tokens/s of the
   paired statistics (both forwards + features + float64 statistics), and the peak memory above
   the loaded models at two token counts, each in a fresh process (flat in tokens);
3. the planner (``kvbridge.fit.plan``) against that fit: statistics bytes, artifact bytes, and
   the time at the rates :func:`kvbridge.fit.plan_rates.measure_rates` measures here (the
   estimate ``kvbridge fit --plan --calibrate cpu`` prints; ``bench/bench_plan.py`` checks it on
   more pairs).

Times: medians of --repeats (8,192 tokens: one prefill), ``--threads`` threads (default 1: CPU
time is then robust to a shared machine; both wall and CPU seconds are printed).

    python bench/bench_real.py [--lengths 512,2048,8192] [--fit-tokens 2048,4096] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REF = "smollm2"
STRIDE, TOP_K = 2, 2  # determined at 2,048 tokens: 3 training sequences x 256 observations >= 2 x 3 x 64 features


def timed(fn, repeats: int):
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), out


def next_logits(model, cache, nxt):
    with torch.no_grad():
        return model(input_ids=nxt, cache=cache, use_cache=True).logits[0, -1].float()


def bench_transfer(loaded, lengths, repeats: int) -> list:
    from transformers import DynamicCache

    from kvbridge.family_adapter import weights_fingerprint
    from kvbridge.plugins import get_host
    from kvbridge.prefix.packs import load_pack, save_pack
    from kvbridge.transfer import identity_transfer

    model = loaded.model
    host = get_host()
    adapter = host.adapter_for(model.config.to_dict())
    spec = adapter.spec_of(model)
    gen = torch.Generator().manual_seed(0)
    wfp = weights_fingerprint(model)  # computed once, as a server holding the model would
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvbridge-real-") as tmp:
        for n in lengths:
            n = min(n, int(spec.max_position_embeddings or n) - 1)  # a pack keeps one position to follow
            ids = torch.randint(10, spec.vocab_size, (1, n), generator=gen)
            nxt = torch.randint(10, spec.vocab_size, (1, 1), generator=gen)

            def prefill():
                with torch.no_grad():
                    cache = DynamicCache()
                    model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
                return cache

            pre_w, pre_c, cache = timed(prefill, 1 if n >= 8192 else repeats)
            state = adapter.extract(model, ids, spec=spec)
            tr_w, tr_c, moved = timed(lambda: identity_transfer(state, spec), repeats)
            out = Path(tmp) / f"pack-{n}"
            save_pack(model, out, guide_ids=ids[0].tolist(), weights_fp=wfp)
            pk_w, pk_c, pack = timed(lambda: load_pack(out, model, weights_fp=wfp).cache(model), repeats)
            ref = next_logits(model, cache, nxt)
            d_tr = float((next_logits(model, adapter.inject(moved, model), nxt) - ref).abs().max())
            d_pk = float((next_logits(model, pack, nxt) - ref).abs().max())
            rows.append(
                dict(
                    tokens=n,
                    prefill_s=pre_w,
                    prefill_cpu_s=pre_c,
                    transfer_s=tr_w,
                    transfer_cpu_s=tr_c,
                    pack_s=pk_w,
                    pack_cpu_s=pk_c,
                    transfer_diff=d_tr,
                    pack_diff=d_pk,
                )
            )
            print(
                f"  {n} tokens: prefill {pre_c:.2f} s CPU ({pre_w:.2f} wall), identity transfer {1e3 * tr_c:.1f} ms "
                f"CPU ({1e3 * tr_w:.1f} wall), pack restore {1e3 * pk_c:.1f} ms CPU ({1e3 * pk_w:.1f} wall), "
                f"logit diffs {d_tr:.1e} / {d_pk:.1e}",
                file=sys.stderr,
                flush=True,
            )
    return rows


def _fit_child(tokens: int, out: str) -> None:
    """In a fresh process: load the model, fit smollm2 -> smollm2 on `tokens` random ids, print JSON."""
    from kvbridge.fit import fit
    from kvbridge.models import load

    loaded = load(REF, dtype="float32")
    model = loaded.model
    ids = torch.randint(10, model.config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(1))
    base = _rss_kib()
    _reset_peak()
    t0, c0 = time.perf_counter(), time.process_time()
    mapping = fit(
        model,
        model,
        ids,
        seq_len=512,
        stride=STRIDE,
        out=out,
        overwrite=True,
        distributed=None,
        top_k=TOP_K,
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = _peak_kib()
    print(
        json.dumps(
            {
                "tokens": tokens,
                "wall_s": wall,
                "cpu_s": cpu,
                "peak_above_models_mib": (peak - base) / 1024,
                "passes": mapping.report.passes if hasattr(mapping.report, "passes") else mapping.report.get("passes"),
                "artifact_bytes": (Path(out) / "mapping.safetensors").stat().st_size,
            }
        )
    )


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _peak_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def gemm_rate(dtype, n: int = 1024, reps: int = 5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        c0 = time.process_time()
        torch.mm(a, b)
        best = min(best, time.process_time() - c0)
    return 2 * n**3 / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="512,2048,8192")
    ap.add_argument("--fit-tokens", default="2048,4096")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--_fit", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args._fit:
        _fit_child(int(args._fit[0]), args._fit[1])
        return
    from kvbridge.fit.plan import plan
    from kvbridge.models import load

    print(
        f"# bench_real: {REF} (SmolLM2-135M-Instruct Q4_1 GGUF, float32), torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), load average {os.getloadavg()[0]:.1f}\n"
    )
    if args.lengths:
        loaded = load(REF, dtype="float32")
        rows = bench_transfer(loaded, [int(x) for x in args.lengths.split(",")], args.repeats)
        print(
            "| tokens | prefill s (CPU) | identity transfer ms (CPU) | prefill / transfer | transfer µs / token "
            "| pack restore ms (CPU) | prefill / restore | max abs logit diff transfer / pack |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['tokens']:,} | {r['prefill_cpu_s']:.2f} | {1e3 * r['transfer_cpu_s']:.1f} | "
                f"{r['prefill_cpu_s'] / r['transfer_cpu_s']:.0f}x | {1e6 * r['transfer_cpu_s'] / r['tokens']:.1f} | "
                f"{1e3 * r['pack_cpu_s']:.1f} | {r['prefill_cpu_s'] / r['pack_cpu_s']:.0f}x | "
                f"{r['transfer_diff']:.1e} / {r['pack_diff']:.1e} |"
            )
        print(
            "\nwall seconds (same runs): "
            + "; ".join(
                f"{r['tokens']}: prefill {r['prefill_s']:.2f}, transfer {1e3 * r['transfer_s']:.1f} ms, "
                f"pack {1e3 * r['pack_s']:.1f} ms"
                for r in rows
            )
            + "\n"
        )
        del loaded
    if not args.fit_tokens:
        return
    from kvbridge.fit.plan_rates import measure_rates

    r32, r64 = gemm_rate(torch.float32), gemm_rate(torch.float64)
    rates = measure_rates(REF, REF, seq_len=512, batch_size=4, stride=STRIDE, top_k=TOP_K)
    fits = []
    with tempfile.TemporaryDirectory(prefix="kvbridge-realfit-") as tmp:
        for n in [int(x) for x in args.fit_tokens.split(",")]:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--threads",
                    str(args.threads),
                    "--_fit",
                    str(n),
                    str(Path(tmp) / f"map-{n}"),
                ],
                capture_output=True,
                text=True,
            )
            if out.returncode:
                raise SystemExit(out.stderr[-2000:])
            fits.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"Fit smollm2 -> smollm2 (ridge, top-k {TOP_K}, seq-len 512, stride {STRIDE}; measured GEMM rates: float32 "
        f"{r32 / 1e9:.1f} GFLOP/s, float64 {r64 / 1e9:.1f} GFLOP/s)\n"
    )
    print(
        "| tokens | fit s (CPU) | tokens/s | peak MiB above models | statistics MiB (fit) | planned MiB "
        "| artifact bytes | planned bytes | planned s (measured rates) | measured / planned time |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in fits:
        p = plan(REF, REF, tokens=f["tokens"], seq_len=512, stride=STRIDE, top_k=TOP_K, rates=rates)
        stats = max(x["bytes"] for x in f["passes"]) if f["passes"] else float("nan")
        print(
            f"| {f['tokens']:,} | {f['cpu_s']:.1f} | {f['tokens'] / f['cpu_s']:,.0f} | "
            f"{f['peak_above_models_mib']:.0f} | {stats / 2**20:.0f} | {p.statistics_bytes / 2**20:.0f} | "
            f"{f['artifact_bytes']:,} | {p.artifact_bytes:,} | {p.seconds:.1f} | {f['cpu_s'] / p.seconds:.2f} |"
        )


if __name__ == "__main__":
    main()
