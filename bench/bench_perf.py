"""Issue 25's table in one run: map / transfer vs their GEMM floor and vs the same algorithm written
plainly, fit time and peak memory vs the planner, artifact save / load.

Geometry 24x2x64 -> 28x2x128 (a Qwen2.5-0.5B-like source cache, a 1.5B-like target), top-k 4,
float32, random weights and states from fixed seeds.

- **floor**: ONE ``torch.mm`` with the mapping's FLOPs (``[T, 512] @ [512, 2·28·256]``), timed in
  the same loop as the work, alternately;
- **plain**: the same algorithm written plainly, per target layer: ``torch.cat`` of the selected
  source layers' heads, one ``x @ W + b``, a reshape/transpose into the target layout. This is a
  stand-in for the peer implementation (souvikDevloper/kvbridge), NOT the peer's code: the peer is
  not installed here, so "vs plain" measures our layout work against a straightforward one;
- **transfer**: ``kvbridge.transfer.transfer`` (strip RoPE + map + re-apply RoPE), with our map
  and with the plain one (same RoPE codec both times);
- **fit**: the ridge fitter on synthetic paired features (no model forwards: ``bench_fit.
  SyntheticCalibration``), each in a fresh process; peak RSS above the process once the features
  exist (``VmHWM`` after ``clear_refs``), against the planner's statistics and its predicted peak
  (statistics + float64 workspace, :func:`kvbridge.fit.plan.job_bytes`), with no budget and with a
  ``--memory`` budget that blocks target layers;
- **save / load**: a mapping artifact (28 MiB) through ``write_artifact`` (hash while writing) and,
  in the same loop, the previous path (``torch.isfinite`` over every tensor, ``save_file``, a second
  read for the sha256), and ``load_mapping``.

Medians of ``--repeats`` alternating runs, wall clock, at the default thread count
(``torch.get_num_threads()`` at start-up) and at 1 thread. Run it alone:

    flock /tmp/kvbridge-heavy.lock .venv/bin/python bench/bench_perf.py [--tokens 512,2048,8192] [--repeats 5]
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

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_fit import SyntheticCalibration, llama_spec, random_mapping, random_state  # noqa: E402

GEOMETRY = ((24, 2, 64), (28, 2, 128))


def specs():
    _, _, src = llama_spec(24, 896, 14, 2, 64)
    _, _, tgt = llama_spec(28, 512, 4, 2, 128)
    return src, tgt


class PlainMapping:
    """The stand-in for the peer: the same affine maps, written plainly per target layer."""

    def __init__(self, mapping):
        self.m = mapping
        self.exact = False

    def map_tensors(self, keys, values):
        ht, dt = self.m.target_spec.num_kv_heads, self.m.target_spec.head_dim
        out = ([], [])
        for lm in self.m.layers:
            for i, (tensors, w, b) in enumerate(((keys, lm.wk, lm.bk), (values, lm.wv, lm.bv))):
                bsz, _, t, _ = tensors[0].shape
                x = torch.cat([tensors[s].transpose(1, 2).reshape(bsz, t, -1) for s in lm.sources], dim=-1)
                y = x @ w + b
                out[i].append(y.view(bsz, t, ht, dt).transpose(1, 2).contiguous())
        return out

    def map_content(self, state, target_spec=None):
        from kvbridge.kvstate import KVState

        keys, values = self.map_tensors(state.keys, state.values)
        return KVState(
            keys=tuple(keys),
            values=tuple(values),
            token_ids=state.token_ids,
            positions=state.positions,
            spec=target_spec or self.m.target_spec,
            rope_applied=False,
            rope_lengths=None,
            model_fingerprint="",
            approximate=True,
            meta=dict(state.meta),
        )


def before_map(mapping, keys, values, chunk: int = 256):
    """The dense map as it was before issue 25 (commit d54f269, kept here for the comparison): per
    target layer and 256-token chunk, a copy per selected source layer into a reused buffer, one
    ``addmm`` into a reused scratch, one copy into the target layout."""
    hs, ds = mapping.source_spec.num_kv_heads, mapping.source_spec.head_dim
    ht, dt = mapping.target_spec.num_kv_heads, mapping.target_spec.head_dim
    b, _, t, _ = keys[0].shape
    out_k, out_v = [], []
    for name, tensors, out in (("k", keys, out_k), ("v", values, out_v)):
        bufs: dict = {}
        scratch = torch.empty(min(t, chunk), ht * dt)
        for lm in mapping.layers:
            w, bias = (lm.wk, lm.bk) if name == "k" else (lm.wv, lm.bv)
            sources = lm.sources
            y = torch.empty(b, ht, t, dt)
            buf = bufs.get(len(sources))
            if buf is None:
                buf = bufs[len(sources)] = torch.empty(min(t, chunk), len(sources), hs * ds)
            for r in range(b):
                for a in range(0, t, chunk):
                    e = min(t, a + chunk)
                    xb, sb = buf[: e - a], scratch[: e - a]
                    for j, layer in enumerate(sources):
                        xb[:, j].view(e - a, hs, ds).copy_(tensors[layer][r, :, a:e].transpose(0, 1))
                    torch.addmm(bias, xb.view(e - a, -1), w, out=sb)
                    y[r, :, a:e].copy_(sb.view(e - a, ht, dt).transpose(0, 1))
            out.append(y)
    return out_k, out_v


def timed(runs: dict, repeats: int) -> dict:
    for fn in runs.values():  # warm-up
        fn()
    out = {k: [] for k in runs}
    for _ in range(repeats):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            out[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in out.items()}


def map_rows(tokens: list, repeats: int) -> list:
    from kvbridge.transfer import transfer

    src, tgt = specs()
    mapping = random_mapping(src, tgt, 4)
    plain = PlainMapping(mapping)
    rows = []
    for n in tokens:
        state = random_state(src, n)
        content = state.strip_rope()
        fs, ft = 2 * 64, 2 * 128
        x, w, out = torch.randn(n, 4 * fs), torch.randn(4 * fs, 2 * 28 * ft), torch.empty(n, 2 * 28 * ft)
        assert 2 * n * x.shape[1] * w.shape[1] == mapping.flops(n)
        ours_k, _ = mapping.map_tensors(content.keys, content.values)
        ref_k, _ = plain.map_tensors(content.keys, content.values)
        agree = max(float((a - b).abs().max()) for a, b in zip(ours_k, ref_k))
        t = timed(
            {
                "map": lambda: mapping.map_tensors(content.keys, content.values),
                "before map": lambda: before_map(mapping, content.keys, content.values),
                "plain map": lambda: plain.map_tensors(content.keys, content.values),
                "transfer": lambda: transfer(state, mapping, tgt),
                "plain transfer": lambda: transfer(state, plain, tgt),
                "floor": lambda: torch.mm(x, w, out=out),
            },
            repeats,
        )
        rows.append({"tokens": n, **t, "agree": agree})
    return rows


# -- fit memory (fresh process each) ----------------------------------------------------------------------
def _fit_child(n: int, budget_mib: float | None) -> None:
    from kvbridge.fit.plan import job_bytes
    from kvbridge.fit.ridge import RidgeFitter

    src, tgt = specs()
    cal = SyntheticCalibration(24, 2, 64, 28, 2, 128, n, batch=512)  # the "data": features in memory

    def status(field):
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field + ":"))

    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset the high-water mark: the peak of the fit alone
    base = status("VmRSS")
    opts = RidgeFitter.Options(top_k=4, memory_budget=None if budget_mib is None else int(budget_mib * 2**20))
    t0 = time.perf_counter()
    m = RidgeFitter().fit(src, tgt, cal, opts)
    secs = time.perf_counter() - t0
    peak = status("VmHWM") - base
    fs, ft = 128, 256
    planned = []
    for p in m.report.passes:  # statistics + workspace of each pass, by the planner's formula
        tl = p.get("target_layers", list(range(28)))
        xx = "layer" if p["tag"].startswith("select") else "full"
        n_src = 24 if xx == "layer" or p["tag"] == "joint" else round((p["bytes"] / 32 / len(tl) / ft) // fs) or 1
        if xx == "full" and p["tag"] != "joint":  # recover the source-layer union from the bytes
            from kvbridge.fit.plan import layer_stats_bytes

            n_src = next(u for u in range(1, 25) if layer_stats_bytes(u, len(tl), fs, 64, ft, "full") == p["bytes"])
        planned.append(job_bytes(n_src, len(tl), fs, 64, ft, xx))
    print(
        json.dumps(
            {
                "n": n,
                "seconds": secs,
                "peak": peak,
                "stats": max(p["bytes"] for p in m.report.passes),
                "planned_peak": max(planned),
                "passes": len(m.report.passes),
                "budget": opts.memory_budget,
            }
        )
    )


def fit_rows(n: int, budgets: list) -> list:
    rows = []
    for budget in budgets:
        cmd = [sys.executable, __file__, "--fit-child", str(n)] + ([] if budget is None else ["--budget", str(budget)])
        res = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        if res.returncode:
            raise SystemExit(res.stderr[-600:])
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    return rows


# -- save / load ---------------------------------------------------------------------------------------------
def _old_write(out: Path, tensors: dict, manifest: dict) -> None:
    """The save path before this change: isfinite over every tensor, save_file, a second read to hash."""
    from safetensors.torch import save_file

    from kvbridge.artifacts import MANIFEST, atomic_dir, sha256_file

    for t in tensors.values():
        assert bool(torch.isfinite(t).all())
    with atomic_dir(out, kind="kvbridge-mapping") as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp / "mapping.safetensors"))
        full = {
            **manifest,
            "tensor_file": "mapping.safetensors",
            "tensor_sha256": sha256_file(tmp / "mapping.safetensors"),
        }
        (tmp / MANIFEST).write_text(json.dumps(full, indent=2, sort_keys=True, default=str) + "\n")


def save_rows(repeats: int) -> dict:
    from kvbridge.artifacts import write_artifact

    src, tgt = specs()
    tensors = random_mapping(src, tgt, 4).tensors()
    with tempfile.TemporaryDirectory() as d:
        i = [0]

        def new():
            i[0] += 1
            write_artifact(
                Path(d) / f"n{i[0]}",
                tensors,
                {"kind": "kvbridge-mapping"},
                tensor_file="mapping.safetensors",
                kind="kvbridge-mapping",
            )

        def old():
            i[0] += 1
            _old_write(Path(d) / f"o{i[0]}", tensors, {"kind": "kvbridge-mapping"})

        def load():
            from kvbridge.artifacts import read_artifact

            read_artifact(Path(d) / "n1")

        t = timed({"save": new, "save (before)": old, "load": load}, repeats)
    t["mib"] = sum(v.numel() * v.element_size() for v in tensors.values()) / 2**20
    return t


def profile_lines(n: int) -> list:
    """Where one call's time goes (torch profiler, self CPU time per call, top operators)."""
    from torch.profiler import profile

    src, tgt = specs()
    mapping = random_mapping(src, tgt, 4)
    plain = PlainMapping(mapping)
    content = random_state(src, n).strip_rope()
    out = []
    for name, fn in (
        ("ours", lambda: mapping.map_tensors(content.keys, content.values)),
        ("plain", lambda: plain.map_tensors(content.keys, content.values)),
        ("before", lambda: before_map(mapping, content.keys, content.values)),
    ):
        fn()
        with profile() as prof:
            for _ in range(3):
                fn()
        top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:4]
        out.append(
            f"{name}: "
            + ", ".join(f"`{e.key}` {e.self_cpu_time_total / 3e3:.0f} ms ({e.count // 3} calls)" for e in top)
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,2048,8192")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fit-obs", type=int, default=2048)
    ap.add_argument("--budget-mib", type=float, default=256.0, help="the --memory budget of the blocked fit row")
    ap.add_argument("--threads", default=None, help="comma list (default: the default count, then 1)")
    ap.add_argument("--profile", type=int, default=2048, help="tokens of the profiler pass (0: none)")
    ap.add_argument("--fit-child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fit_child is not None:
        _fit_child(args.fit_child, args.budget)
        return
    default = torch.get_num_threads()
    threads = [int(x) for x in args.threads.split(",")] if args.threads else list(dict.fromkeys([default, 1]))
    tokens = [int(x) for x in args.tokens.split(",")]
    print(
        f"# bench_perf: 24x2x64 -> 28x2x128, top-k 4, float32; torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"default threads {default}, load average {os.getloadavg()[0]:.1f}; medians of {args.repeats}, wall clock\n"
    )
    print(
        "| threads | figure | tokens | ours ms | plain ms | floor ms | ours / plain | ours / floor | plain / floor | "
        "before / floor |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    agree = 0.0
    for th in threads:
        torch.set_num_threads(th)
        for r in map_rows(tokens, args.repeats):
            agree = max(agree, r["agree"])
            for fig, ours, plain in (("map", "map", "plain map"), ("transfer", "transfer", "plain transfer")):
                before = f"{r['before map'] / r['floor']:.2f}" if fig == "map" else ""
                print(
                    f"| {th} | {fig} | {r['tokens']:,} | {1e3 * r[ours]:.1f} | {1e3 * r[plain]:.1f} | "
                    f"{1e3 * r['floor']:.1f} | {r[ours] / r[plain]:.2f} | {r[ours] / r['floor']:.2f} | "
                    f"{r[plain] / r['floor']:.2f} | {before} |"
                )
        sys.stdout.flush()
    torch.set_num_threads(default)
    print(f"\nOurs and plain agree to {agree:.1e} (max |diff|, float32).\n")
    if args.profile:
        for th in threads:
            torch.set_num_threads(th)
            for line in profile_lines(args.profile):
                print(f"- {th} thread(s), {args.profile:,} tokens: {line}")
        torch.set_num_threads(default)
        print()
    print(
        "| fit (ridge, top-k 4, synthetic features, forwards excluded) | observations | passes | seconds | "
        "statistics MiB (planner) | planned peak MiB (statistics + workspace) | measured peak MiB | measured / planned "
        "| measured / statistics |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in fit_rows(args.fit_obs, [None, args.budget_mib]):
        label = "no budget (8 GiB default)" if r["budget"] is None else f"--memory {r['budget'] / 2**20:.0f} MiB"
        print(
            f"| {label} | {r['n']:,} | {r['passes']} | {r['seconds']:.1f} | {r['stats'] / 2**20:.0f} | "
            f"{r['planned_peak'] / 2**20:.0f} | {r['peak'] / 2**20:.0f} | {r['peak'] / r['planned_peak']:.2f} | "
            f"{r['peak'] / r['stats']:.2f} |"
        )
    s = save_rows(max(args.repeats, 7))
    print(f"\n| artifact ({s['mib']:.1f} MiB mapping) | ms |\n|---|---:|")
    for k in ("save", "save (before)", "load"):
        print(f"| {k} | {1e3 * s[k]:.1f} |")
    print(f"\nsave / save (before): {s['save'] / s['save (before)']:.2f}")


if __name__ == "__main__":
    main()
