"""RoPE codec throughput: strip + apply over a 28-layer cache vs the memory-bandwidth floor.

The cache is the shape of a Qwen2.5-1.5B-like model (28 layers x [1, 2 KV heads, 2048 tokens,
128 head dim], half-split RoPE, theta 1e6), in float32 and bfloat16. Each layer is a separate
call, as ``KVState.strip_rope()`` / ``apply_rope()`` make them (one positions tensor shared
by all layers, so the table is built once per pass: "warm"; "cold" clears every cache first).

The floor of an operation is the bytes it must move (read + write of the keys, tables
excluded) divided by the measured copy bandwidth (``clone()`` of a large tensor, and
``copy_`` into a preallocated one, whichever is faster); "of floor" = floor time / measured
time. "of layer clones" compares with ``clone()`` of the same 28 layer tensors (the same
bytes), run alternately with the operation, which stays meaningful on a shared, noisy CPU.
Times are the median of ``--repeats`` passes (after a warm-up), on CUDA when available.

Kernels (``--kernels``, :mod:`kvbridge.rope_kernels` modes): ``eager`` (torch ops), ``native`` (the
C++ kernel of :mod:`kvbridge.rope_native`); each row is one kernel and operation, and the ``floor:`` rows are the reference kernels themselves (``clone()``
and ``x*2`` of the same 28 layers, and the copy-bandwidth floor). A last table gives each
kernel's first-call cost (build, load, self-check), measured in fresh processes. The
``torch.compile`` formulations (the removed ``compiled`` kernel among them) are measured side by side
with the native kernel in the "apply by formulation" table.

    python bench/bench_rope.py [--device cpu|cuda] [--repeats N] [--interleaved] [--threads N] [--clock wall|cpu]
                               [--kernels eager,native] [--no-first-call]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from kvbridge import rope as R
from kvbridge.plugins import get_host
from kvbridge.spec import RopeSpec

LAYERS, HEADS, TOKENS, HEAD_DIM = 28, 2, 2048, 128
CLOCK = time.perf_counter  # --clock cpu: time.process_time (CPU time of this process)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(repeats):
        t0 = CLOCK()
        fn()
        sync(device)
        out.append(CLOCK() - t0)
    return statistics.median(out)


def timed_pair(fn, ref, device, repeats: int, ref2=None) -> tuple:
    """Median times of ``fn``, ``ref`` (and ``ref2``), run alternately (fair on a shared, noisy machine)."""
    fns = [fn, ref] + ([ref2] if ref2 is not None else [])
    for _ in range(2):
        for f in fns:
            f()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for f, out in zip(fns, times):
            sync(device)
            t0 = CLOCK()
            f()
            sync(device)
            out.append(CLOCK() - t0)
    return tuple(statistics.median(t) for t in times)


def copy_bandwidth(device, repeats: int) -> tuple[float, float]:
    """(clone GB/s, copy_ GB/s) of a 512 MiB float32 tensor (bytes read + written)."""
    n = (512 << 20) // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * src.element_size()
    t_clone = timed(lambda: src.clone(), device, repeats)
    t_copy = timed(lambda: dst.copy_(src), device, repeats)
    return nbytes / t_clone / 1e9, nbytes / t_copy / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--interleaved", action="store_true", help="GPT-J/Cohere pairing instead of half split")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: this process's CPU time (with --threads 1, robust to a shared machine)",
    )
    ap.add_argument(
        "--kernels",
        default="eager,native",
        help="RoPE kernels to measure (kvbridge.rope_kernels modes; native: half split only)",
    )
    ap.add_argument("--no-first-call", action="store_true", help="skip the first-call cost table")
    ap.add_argument(
        "--no-candidates", action="store_true", help="skip the table of torch.compile formulations (apply, half split)"
    )
    args = ap.parse_args()
    global CLOCK
    if args.clock == "cpu":
        CLOCK = time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)

    spec = get_host().resolved(
        RopeSpec.make(
            "default", 1_000_000.0, head_dim=HEAD_DIM, interleaved=args.interleaved, max_position_embeddings=32768
        )
    )
    old = torch.arange(TOKENS, device=device)[None]
    new = old + 100
    clone_bw, copy_bw = copy_bandwidth(device, args.repeats)
    bw = max(clone_bw, copy_bw)

    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        keys = [torch.randn(1, HEADS, TOKENS, HEAD_DIM, device=device).to(dtype) for _ in range(LAYERS)]
        layer_bytes = keys[0].numel() * keys[0].element_size()
        stripped = [R.strip(k, old, spec) for k in keys]

        # each layer's result is consumed and dropped before the next (a streaming pipeline:
        # the allocator reuses the block); "kept" holds all 28 outputs, as a KVState does,
        # which on the CPU adds fresh-page faults (the same for clone(): see the last column)
        def strip_all():
            for k in keys:
                R.strip(k, old, spec)

        def apply_all():
            for k in stripped:
                R.apply(k, new, spec)

        def strip_apply():
            for k in keys:
                R.apply(R.strip(k, old, spec), new, spec)

        def strip_apply_kept():
            return [R.apply(R.strip(k, old, spec), new, spec) for k in keys]

        def reposition_all():
            for k in keys:
                R.reposition(k, old, new, spec)

        def cold(fn):
            def run():
                R.clear_caches()
                return fn()

            return run

        def clone_layers():  # the same bytes as one strip: read + write every layer once
            for k in keys:
                k.clone()

        def clone_layers_kept():
            return [k.clone() for k in keys]

        def double_layers():  # the same bytes through an elementwise kernel: x * 2
            for k in keys:
                torch.mul(k, 2)

        ops = [
            ("strip", strip_all, 2, clone_layers),
            ("apply", apply_all, 2, clone_layers),
            ("strip + apply", strip_apply, 4, clone_layers),
            ("strip + apply, cold tables", cold(strip_apply), 4, clone_layers),
            ("strip + apply, 28 outputs kept", strip_apply_kept, 4, clone_layers_kept),
            ("reposition (fused)", reposition_all, 2, clone_layers),
        ]
        from kvbridge import rope_kernels

        dname = str(dtype).replace("torch.", "")
        t_clone, t_mul = timed_pair(clone_layers, double_layers, device, args.repeats)
        nbytes = 2 * LAYERS * layer_bytes
        floor = nbytes / (bw * 1e9)
        for name, t in (("floor: clone() of the layers", t_clone), ("floor: x*2 of the layers", t_mul)):
            rows.append(
                (
                    dname,
                    "-",
                    name,
                    t * 1e3,
                    nbytes / (1 << 20),
                    nbytes / t / 1e9,
                    floor * 1e3,
                    floor / t,
                    t_clone / t,
                    t_mul / t,
                )
            )
        rows.append(
            (
                dname,
                "-",
                "floor: copy bandwidth",
                floor * 1e3,
                nbytes / (1 << 20),
                bw,
                floor * 1e3,
                1.0,
                t_clone / floor,
                t_mul / floor,
            )
        )
        for kernel in args.kernels.split(","):
            if kernel != "eager" and args.interleaved:
                continue
            rope_kernels.set_mode(kernel)
            for name, fn, passes, ref in ops:
                t, t_ref, t_mul = timed_pair(fn, ref, device, args.repeats, double_layers)
                nbytes = passes * LAYERS * layer_bytes
                floor = nbytes / (bw * 1e9)
                rows.append(
                    (
                        dname,
                        kernel,
                        name,
                        t * 1e3,
                        nbytes / (1 << 20),
                        nbytes / t / 1e9,
                        floor * 1e3,
                        floor / t,
                        (passes / 2) * t_ref / t,
                        (passes / 2) * t_mul / t,
                    )
                )
        rope_kernels.set_mode(None)

    layout = "interleaved" if args.interleaved else "half split"
    threads = torch.get_num_threads() if device.type == "cpu" else None
    where = f"{device.type}" + (f", {threads} threads" if threads else f" ({torch.cuda.get_device_name(device)})")
    where += f", {args.clock} clock"
    print(
        f"RoPE codec, {LAYERS} layers x [1, {HEADS}, {TOKENS}, {HEAD_DIM}], {layout}, {where}; "
        f"torch {torch.__version__}"
    )
    print(
        f"copy bandwidth (read + write): clone {clone_bw:.1f} GB/s, copy_ {copy_bw:.1f} GB/s; floor uses {bw:.1f} GB/s"
    )
    print()
    print(f"load average {__import__('os').getloadavg()[0]:.1f}")
    print()
    print(
        "| dtype | kernel | operation | ms / 28 layers | MiB moved | GB/s | floor ms | of floor | of layer clones "
        "| of layer x*2 |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for dtype, kernel, name, ms, mib, gbs, floor_ms, frac, vs_clone, vs_mul in rows:
        print(
            f"| {dtype} | {kernel} | {name} | {ms:.2f} | {mib:.0f} | {gbs:.1f} | {floor_ms:.2f} | {frac:.0%} "
            f"| {vs_clone:.0%} | {vs_mul:.0%} |"
        )
    print()
    print(
        "floor = bytes moved (keys read + written, tables excluded) / copy bandwidth; 'of layer clones' = "
        "time of clone() of the same layers, as many read+write passes, run alternately with the "
        "operation / operation time; 'of layer x*2' = the same with torch.mul(k, 2), the floor of an "
        "elementwise kernel (clone() is a memcpy and beats any elementwise kernel on this CPU)"
    )
    if not args.no_candidates and not args.interleaved:
        compiled_candidates(device, args.repeats, bw)
    if not args.no_first_call and device.type == "cpu":
        first_call_table([k for k in args.kernels.split(",") if not args.interleaved or k == "eager"])


def _cand_stack(x, cos, sin, out_dtype):  # the removed compiled kernel (kvbridge.rope_compile until issue 33)
    xv = x.unflatten(-1, (2, cos.shape[-1])).to(cos.dtype)
    x1, x2 = xv[..., 0, :], xv[..., 1, :]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-2).flatten(-2).to(out_dtype)


def _cand_out(x, cos, sin, out_dtype):  # both halves written into a preallocated output
    h = cos.shape[-1]
    x1, x2 = x[..., :h].to(cos.dtype), x[..., h:].to(cos.dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    out[..., :h] = (x1 * cos - x2 * sin).to(out_dtype)
    out[..., h:] = (x2 * cos + x1 * sin).to(out_dtype)
    return out


def _cand_cat(x, cos, sin, out_dtype):  # the models' own formula: x*cos + rotate_half(x)*sin
    h = cos.shape[-1]
    xc = x.to(cos.dtype)
    rot = torch.cat((-xc[..., h:], xc[..., :h]), dim=-1)
    return (xc * torch.cat((cos, cos), -1) + rot * torch.cat((sin, sin), -1)).to(out_dtype)


def _cand_f32(x, cos, sin, out_dtype):  # computed in float32, rounded once (not exact in bf16)
    h = cos.shape[-1]
    c, s = cos.float(), sin.float()
    x1, x2 = x[..., :h].float(), x[..., h:].float()
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-2).flatten(-2).to(out_dtype)


def compiled_candidates(device, repeats: int, bw: float) -> None:
    """torch.compile formulations of ``apply`` (tables in the keys' dtype), side by side with the
    native kernel and x*2 of the same 28 layers; "bits" = equal to the eager (models') rotation."""
    from kvbridge import rope_native

    spec = get_host().resolved(RopeSpec.make("default", 1_000_000.0, head_dim=HEAD_DIM, max_position_embeddings=32768))
    pos = torch.arange(TOKENS, device=device)[None]
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        keys = [torch.randn(1, HEADS, TOKENS, HEAD_DIM, device=device).to(dtype) for _ in range(LAYERS)]
        kern = R._tables_for(spec, pos, None, device, None).kernel(dtype, inverse=False)
        want = [kern.eager(k, HEAD_DIM, False) for k in keys]
        nbytes = 2 * LAYERS * keys[0].numel() * keys[0].element_size()

        def mul2():
            for k in keys:
                torch.mul(k, 2)

        cands = []
        for name, fn in (
            ("compiled: stack (the removed kernel)", _cand_stack),
            ("compiled: preallocated out", _cand_out),
            ("compiled: models' cat formula", _cand_cat),
            ("compiled: float32, one rounding", _cand_f32),
        ):
            for dynamic in (True, False):
                label = f"{name}, dynamic={dynamic}"
                try:
                    cf = torch.compile(fn, dynamic=dynamic, options={"emulate_precision_casts": True})
                    t0 = time.perf_counter()
                    cf(keys[0], kern.cos, kern.sin, dtype)
                    t_first = time.perf_counter() - t0
                except Exception as exc:  # noqa: BLE001 - a bench row, not a failure
                    rows.append(
                        (
                            str(dtype)[6:],
                            label,
                            float("nan"),
                            float("nan"),
                            False,
                            float("nan"),
                            f"{type(exc).__name__}",
                        )
                    )
                    continue
                cands.append((label, t_first, lambda k, cf=cf: cf(k, kern.cos, kern.sin, dtype)))
        if device.type == "cpu" and rope_native.compiler() is not None:
            t0 = time.perf_counter()
            rope_native.library()
            cands.append(
                (
                    "native",
                    time.perf_counter() - t0,
                    lambda k: rope_native.rotate(k, kern.cos, kern.sin, dtype, exact=True, rotary_dim=HEAD_DIM),
                )
            )
        cands.append(("eager", float("nan"), lambda k: kern.eager(k, HEAD_DIM, False)))
        for label, t_first, one in cands:
            bits = all(torch.equal(one(k), w) for k, w in zip(keys, want))

            def run(one=one):  # streaming: each output dropped before the next, as the main table
                for k in keys:
                    one(k)

            t, t_mul = timed_pair(run, mul2, device, repeats)
            rows.append((str(dtype)[6:], label, t * 1e3, t_first, bits, t_mul / t, f"{nbytes / (bw * 1e9) / t:.0%}"))
    print()
    print(
        "apply (exact path) by formulation, the same 28 layers, side by side with x*2 (first call: "
        "compile of this shape with inductor's on-disk cache as this machine has it; native: load or build "
        "of the library):"
    )
    print()
    print("| dtype | kernel | ms / 28 layers | first call s | bits = eager | of layer x*2 | of floor |")
    print("|---|---|---:|---:|---|---:|---:|")
    for dtype, label, ms, first, bits, vs_mul, of_floor in rows:
        print(f"| {dtype} | {label} | {ms:.2f} | {first:.1f} | {'yes' if bits else 'NO'} | {vs_mul:.0%} | {of_floor} |")


FIRST_CALL = """
import sys, time, torch
torch.set_num_threads(1)
from kvbridge import rope as R, rope_kernels
from kvbridge.plugins import get_host
from kvbridge.spec import RopeSpec
spec = get_host().resolved(RopeSpec.make("default", 1e6, head_dim=128, max_position_embeddings=32768))
pos = torch.arange(2048)[None]
k = torch.randn(1, 2, 2048, 128).to(getattr(torch, sys.argv[2]))
rope_kernels.set_mode(sys.argv[1])
t0 = time.perf_counter(); R.apply(R.strip(k, pos, spec), pos + 100, spec); t1 = time.perf_counter()
R.apply(R.strip(k, pos, spec), pos + 100, spec); t2 = time.perf_counter()
print(t1 - t0, t2 - t1, sorted(set(rope_kernels._STATUS.values())))
"""


def first_call_table(kernels) -> None:
    """Wall time of one strip + apply of one layer in a fresh process: first call vs second call.

    ``native, cold``: an empty ``$KVBRIDGE_HOME`` (the library is built); ``native``: built
    before (loaded from the cache); ``compiled``: torch.compile with inductor's on-disk cache as
    this machine has it (the first run of a machine is slower still)."""
    runs = []
    with tempfile.TemporaryDirectory() as home:
        for kernel in kernels:
            for dtype in ("float32", "bfloat16"):
                envs = [("", {})]
                if kernel == "native":
                    envs = [
                        (", cold", {"KVBRIDGE_HOME": home, "KVBRIDGE_NO_CACHE": ""}),
                        ("", {"KVBRIDGE_HOME": home, "KVBRIDGE_NO_CACHE": ""}),
                    ]
                for tag, extra in envs:
                    if tag == ", cold":
                        for f in os.listdir(home):
                            __import__("shutil").rmtree(os.path.join(home, f), ignore_errors=True)
                    env = {**os.environ, **extra}
                    proc = subprocess.run(
                        [sys.executable, "-c", FIRST_CALL, kernel, dtype], env=env, capture_output=True, text=True
                    )
                    if proc.returncode != 0:
                        runs.append((kernel + tag, dtype, float("nan"), float("nan"), proc.stderr.strip()[-120:]))
                        continue
                    first, second, status = proc.stdout.split(" ", 2)
                    used = {"[]": "", "[True]": "checked, in use", "[False]": "eager fallback"}.get(
                        status.strip(), "partly eager"
                    )
                    runs.append((kernel + tag, dtype, float(first), float(second), used))
    print()
    print("First call in a fresh process (strip + apply of one layer [1, 2, 2048, 128], wall clock):")
    print()
    print("| kernel | dtype | first call ms | next call ms | first-call overhead ms | status |")
    print("|---|---|---:|---:|---:|---|")
    for kernel, dtype, first, second, used in runs:
        print(
            f"| {kernel} | {dtype} | {first * 1e3:.1f} | {second * 1e3:.2f} | {(first - second) * 1e3:.1f} | {used} |"
        )


if __name__ == "__main__":
    main()
