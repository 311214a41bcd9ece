"""Device bench (run by bench/gpu.sh on a CUDA machine; on the CPU at tiny sizes in the test suite).

Real-geometry random-weight models built from the manifests' configs (source Qwen/Qwen2.5-1.5B,
target Qwen/Qwen2.5-7B; ``--sizes tiny`` shrinks both to a few layers for the CPU), then at each
of ``--tokens``:

- ``stats``: paired float64 statistics (the fitter's joint ``LayerStats``) on random features of
  the real geometry: observations/s;
- ``mapping``: a random top-4 dense mapping source -> target (``map_tensors``) vs a bare GEMM of
  the same FLOPs (the floor: one ``addmm`` per target layer and K/V), and the map and the whole
  transfer (strip, map, apply) vs the one-``mm`` floor of ``bench/bench_map_split.py`` (the same
  FLOPs as ONE GEMM into a warm output), with the transfer's device memory peak (CUDA);
- ``rope``: half-split strip / apply / reposition of the target's keys vs a same-size ``x * 2``
  (the bandwidth floor of an elementwise kernel);
- ``transfer``: the target's own prefill vs transfer of the source's cache (strip, map, apply);
- ``pack``: prefix-pack save and restore of the target's cache vs its prefill.

Dtype policy (``--dtype auto``): bfloat16 models on CUDA, float32 on the CPU; statistics are
float64 and mappings float32 everywhere (as in kvbridge). Each section is timed with device
synchronisation, median of ``--repeats``; an out-of-memory at one length is recorded and the
bench goes on. Results: JSON (``--out``) and a markdown table on stdout.

    python bench/bench_gpu.py --device cuda --sizes real --tokens 2048,8192,32768 --out results.json
    python bench/bench_gpu.py --device cpu --sizes tiny --tokens 32,64 --out /tmp/r.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

SOURCE, TARGET = "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-7B"
TINY = dict(
    num_hidden_layers=3,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    vocab_size=512,
    max_position_embeddings=4096,
)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def config_of(ref: str, sizes: str, kv_heads: int | None = None) -> dict:
    from kvbridge.models import resolve

    cfg = dict(resolve(ref).config)
    cfg.pop("torch_dtype", None)
    cfg.pop("dtype", None)
    if sizes == "tiny":
        cfg.update(TINY)
        cfg["num_key_value_heads"] = kv_heads or 2
        cfg["head_dim"] = 16
        cfg["tie_word_embeddings"] = False
    cfg["max_position_embeddings"] = max(int(cfg.get("max_position_embeddings") or 0), 32768)
    return cfg


def build(cfg: dict, device, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = AutoConfig.for_model(**cfg)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(conf, dtype=dtype)
    return model.eval()


def random_mapping(sspec, tspec, k: int, device):
    from kvbridge.fit.mapping import FittedMapping, LayerMap

    g = torch.Generator().manual_seed(0)
    fs, ft = sspec.num_kv_heads * sspec.head_dim, tspec.num_kv_heads * tspec.head_dim
    k = min(k, sspec.num_layers)
    layers = [
        LayerMap(
            "dense",
            tuple(int(i) for i in torch.randperm(sspec.num_layers, generator=g)[:k]),
            torch.randn(k * fs, ft, generator=g) / (k * fs) ** 0.5,
            torch.zeros(ft),
            torch.randn(k * fs, ft, generator=g) / (k * fs) ** 0.5,
            torch.zeros(ft),
        )
        for _ in range(tspec.num_layers)
    ]
    return FittedMapping(sspec, tspec, [lm.to(device=device) for lm in layers])


def bench_stats(sspec, tspec, n: int, device, repeats: int) -> dict:
    from kvbridge.fit.stats import LayerStats

    dims = dict(
        src_heads=sspec.num_kv_heads, src_dim=sspec.head_dim, tgt_heads=tspec.num_kv_heads, tgt_dim=tspec.head_dim
    )
    job = LayerStats(range(sspec.num_layers), range(tspec.num_layers), **dims, device=device)
    m = min(n, 512)
    feats = {
        "xk": torch.randn(m, sspec.num_layers, sspec.num_kv_heads, sspec.head_dim, device=device),
        "yk": torch.randn(m, tspec.num_layers, tspec.num_kv_heads, tspec.head_dim, device=device),
    }
    feats["xv"], feats["yv"] = feats["xk"].clone(), feats["yk"].clone()
    held = torch.zeros(m, dtype=torch.bool, device=device)
    batches = max(1, n // m)

    def run():
        for _ in range(batches):
            job.update(feats, held)

    t = timed(run, device, repeats)
    return {
        "observations": batches * m,
        "seconds": t,
        "observations_per_s": batches * m / t,
        "statistics_bytes": job.nbytes(),
    }


def bench_mapping(mapping, sspec, n: int, device, repeats: int) -> dict:
    shape = (1, sspec.num_kv_heads, n, sspec.head_dim)
    keys = [torch.randn(shape, device=device) for _ in range(sspec.num_layers)]
    values = [torch.randn(shape, device=device) for _ in range(sspec.num_layers)]
    ops = []
    for lm in mapping.layers:
        for w, b in ((lm.wk, lm.bk), (lm.wv, lm.bv)):
            ops.append((b, torch.randn(n, w.shape[0], device=device), w, torch.empty(n, w.shape[1], device=device)))

    def floor():
        for b, x, w, out in ops:
            torch.addmm(b, x, w, out=out)

    t_map = timed(lambda: mapping.map_tensors(keys, values), device, repeats)
    t_floor = timed(floor, device, repeats)
    out = {"seconds": t_map, "floor_seconds": t_floor, "ratio": t_map / t_floor, "flops": mapping.flops(n)}
    ops.clear()  # free the floor's operands before the transfer's peak is measured
    # the one-``mm`` floor of bench/bench_peer.py and bench/bench_map_split.py (the same FLOPs as ONE
    # GEMM into a warm output: top-k equal in every layer here) and the whole transfer against it
    from kvbridge.kvstate import KVState
    from kvbridge.transfer import transfer

    f, q = mapping.layers[0].wk.shape[0], 2 * sum(lm.wk.shape[1] for lm in mapping.layers)
    mm = [torch.randn(n, f, device=device), torch.randn(f, q, device=device), torch.empty(n, q, device=device)]
    t_mm = timed(lambda: torch.mm(mm[0], mm[1], out=mm[2]), device, repeats)
    mm.clear()
    state = KVState(
        keys=tuple(keys),
        values=tuple(values),
        token_ids=torch.zeros(1, n, dtype=torch.long, device=device),
        positions=torch.arange(n, device=device)[None],
        spec=sspec,
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    t_tr = timed(lambda: transfer(state, mapping, mapping.target_spec), device, repeats)
    out.update(
        mm_floor_seconds=t_mm,
        map_over_mm_floor=t_map / t_mm,
        transfer_seconds=t_tr,
        transfer_over_mm_floor=t_tr / t_mm,
        # the transfer's device memory peak above what was allocated before it (CUDA; None on the CPU)
        transfer_peak_bytes=torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else None,
    )
    return out


def bench_rope(tspec, n: int, device, dtype, repeats: int) -> dict:
    from kvbridge import rope as R

    spec = tspec.rope_for_layer(0)
    keys = [
        torch.randn(1, tspec.num_kv_heads, n, tspec.head_dim, device=device).to(dtype) for _ in range(tspec.num_layers)
    ]
    pos = torch.arange(n, device=device)[None]
    new = pos + 7
    out = {}
    floor = timed(lambda: [torch.mul(k, 2) for k in keys], device, repeats)
    for name, fn in (
        ("strip", lambda k: R.strip(k, pos, spec)),
        ("apply", lambda k: R.apply(k, pos, spec)),
        ("reposition", lambda k: R.reposition(k, pos, new, spec)),
    ):
        t = timed(lambda: [fn(k) for k in keys], device, repeats)
        out[name] = {"seconds": t, "of_floor": floor / t}
    out["floor_seconds"] = floor
    return out


def bench_transfer_pack(
    source, target, sad, tad, sspec, tspec, mapping, n: int, device, repeats: int, tmp: Path
) -> dict:
    from transformers import DynamicCache

    from kvbridge.prefix.packs import load_pack, save_pack
    from kvbridge.transfer import transfer

    ids = torch.randint(10, min(sspec.vocab_size, tspec.vocab_size), (1, n), device=device)

    def prefill():
        with torch.no_grad():
            cache = DynamicCache()
            target(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        return cache

    t_pre = timed(prefill, device, repeats)
    state = sad.extract(source, ids, spec=sspec)
    t_tr = timed(lambda: transfer(state, mapping, tspec), device, repeats)
    out = tmp / f"pack-{n}"
    t0 = time.perf_counter()
    save_pack(target, out, guide_ids=ids[0].tolist(), weights_fp="bench")
    t_save = time.perf_counter() - t0
    t_load = timed(lambda: load_pack(out, target, weights_fp="bench").cache(target), device, repeats)
    size = (out / "kv.safetensors").stat().st_size
    return {
        "prefill_seconds": t_pre,
        "transfer_seconds": t_tr,
        "prefill_over_transfer": t_pre / t_tr,
        "pack_save_seconds": t_save,
        "pack_restore_seconds": t_load,
        "prefill_over_restore": t_pre / t_load,
        "pack_bytes": size,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", choices=["real", "tiny"], default="real")
    ap.add_argument("--tokens", default="2048,8192,32768")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sections", default="stats,mapping,rope,transfer")
    ap.add_argument("--out", default=None, help="results JSON (default: print only)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = (
        getattr(torch, args.dtype)
        if args.dtype != "auto"
        else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    )
    from kvbridge.plugins import get_host

    host = get_host()
    scfg, tcfg = config_of(SOURCE, args.sizes, 2), config_of(TARGET, args.sizes, 4)
    t0 = time.perf_counter()
    source, target = build(scfg, device, dtype), build(tcfg, device, dtype)
    sad, tad = host.adapter_for(source.config.to_dict()), host.adapter_for(target.config.to_dict())
    sspec, tspec = host.spec_of(source), host.spec_of(target)
    mapping = random_mapping(sspec, tspec, 4, device)
    results = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "sizes": args.sizes,
        "torch": torch.__version__,
        "source": f"{SOURCE} geometry {sspec.num_layers}x{sspec.num_kv_heads}x{sspec.head_dim}",
        "target": f"{TARGET} geometry {tspec.num_layers}x{tspec.num_kv_heads}x{tspec.head_dim}",
        "build_seconds": time.perf_counter() - t0,
        "rows": [],
    }
    sections = set(args.sections.split(","))
    with tempfile.TemporaryDirectory(prefix="kvbridge-gpu-") as tmp:
        for n in [int(x) for x in args.tokens.split(",")]:
            row: dict = {"tokens": n}
            for name, fn in (
                ("stats", lambda: bench_stats(sspec, tspec, n, device, args.repeats)),
                ("mapping", lambda: bench_mapping(mapping, sspec, n, device, args.repeats)),
                ("rope", lambda: bench_rope(tspec, n, device, dtype, args.repeats)),
                (
                    "transfer",
                    lambda: bench_transfer_pack(
                        source, target, sad, tad, sspec, tspec, mapping, n, device, args.repeats, Path(tmp)
                    ),
                ),
            ):
                if name not in sections:
                    continue
                try:
                    row[name] = fn()
                except torch.OutOfMemoryError as exc:  # record it and go on with the next section
                    row[name] = {"error": f"out of memory: {str(exc).splitlines()[0][:160]}"}
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                print(f"  {n} tokens: {name} done", file=sys.stderr, flush=True)
            results["rows"].append(row)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(markdown(results))
    return results


def markdown(res: dict) -> str:
    lines = [
        f"# bench_gpu: {res['device_name']} ({res['dtype']}), source {res['source']}, target {res['target']}, "
        f"torch {res['torch']}, load average {os.getloadavg()[0]:.1f}",
        "",
        "| tokens | stats obs/s | mapping / GEMM floor | map / transfer of the one-mm floor | transfer peak "
        "| RoPE strip / apply / reposition of floor | prefill / transfer | prefill / pack restore |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def get(row, sec, key, fmt):
        v = row.get(sec, {})
        if "error" in v:
            return "OOM"
        return fmt(v) if v else "-"

    for r in res["rows"]:
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{r['tokens']:,}",
                    get(r, "stats", "", lambda v: f"{v['observations_per_s']:,.0f}"),
                    get(r, "mapping", "", lambda v: f"{v['ratio']:.2f}x"),
                    get(
                        r,
                        "mapping",
                        "",
                        lambda v: f"{v['map_over_mm_floor']:.2f}x / {v['transfer_over_mm_floor']:.2f}x",
                    ),
                    get(
                        r,
                        "mapping",
                        "",
                        lambda v: (
                            "-" if v["transfer_peak_bytes"] is None else f"{v['transfer_peak_bytes'] / 2**20:,.0f} MiB"
                        ),
                    ),
                    get(
                        r,
                        "rope",
                        "",
                        lambda v: " / ".join(f"{v[k]['of_floor']:.0%}" for k in ("strip", "apply", "reposition")),
                    ),
                    get(r, "transfer", "", lambda v: f"{v['prefill_over_transfer']:.1f}x"),
                    get(r, "transfer", "", lambda v: f"{v['prefill_over_restore']:.1f}x"),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
