"""Prefix-pack load vs prefill of the same guide, measured side by side.

    python bench/bench_packs.py                       # 512, 2048, 8192 tokens, float32, CPU
    python bench/bench_packs.py --lengths 512,2048 --repeats 5 --threads 2

Model: a randomly initialised Llama (4 layers, hidden 256, 4 heads x 64, 2 KV heads, vocab 32000,
8448 positions): small, but with the shapes of a real one, so attention's quadratic cost shows.
For each guide length the same token ids are (a) prefilled into a fresh DynamicCache (what you pay
without a pack; ``logits_to_keep=1``, so only the last position's logits are computed) and (b) saved once as a pack and then restored: read + sha256 check of the tensor
file + manifest checks + KVState from tensors + inject into a DynamicCache, with a forward
pre-hook counting model calls (must be 0). The weights fingerprint, a one-time cost per process,
is computed once and passed in; it is reported on its own line. Timings are medians of
``--repeats`` runs after one warm-up. A final column checks that the next-token logits after
the restored cache equal those after the prefill.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path


def build_model(max_positions: int, dtype: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(
        num_hidden_layers=4,
        hidden_size=256,
        intermediate_size=688,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=32000,
        max_position_embeddings=max_positions,
    )
    return AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype)).to(device).eval()


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_ms(fn, repeats: int, device: str) -> tuple[float, object]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="512,2048,8192")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)

    import torch
    import transformers
    from transformers import DynamicCache

    from kvbridge.family_adapter import weights_fingerprint
    from kvbridge.prefix.packs import load_pack, save_pack

    transformers.logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    model = build_model(max(8448, max(lengths) + 64), args.dtype, args.device)
    nparams = sum(p.numel() for p in model.parameters())
    t0 = time.perf_counter()
    wfp = weights_fingerprint(model)
    wfp_ms = (time.perf_counter() - t0) * 1000
    calls = [0]
    model.register_forward_pre_hook(lambda m, a, k: calls.__setitem__(0, calls[0] + 1), with_kwargs=True)
    rows = []
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="kvbridge-bench-") as tmp:
        for n in lengths:
            ids = torch.randint(3, 32000, (1, n), generator=gen).to(args.device)
            nxt = torch.randint(3, 32000, (1, 1), generator=gen).to(args.device)

            def prefill():
                with torch.no_grad():
                    cache = DynamicCache()
                    model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
                return cache

            prefill_ms, cache = median_ms(prefill, args.repeats, args.device)
            out = Path(tmp) / f"pack-{n}"
            t0 = time.perf_counter()
            save_pack(model, out, guide_ids=ids[0].tolist(), weights_fp=wfp)
            save_ms = (time.perf_counter() - t0) * 1000
            size = (out / "kv.safetensors").stat().st_size

            def restore():
                pack = load_pack(out, model, weights_fp=wfp)
                c = pack.cache(model)
                if args.device != "cpu":
                    for layer in c.layers:
                        layer.keys, layer.values = layer.keys.to(args.device), layer.values.to(args.device)
                return c

            before = calls[0]
            load_ms, restored = median_ms(restore, args.repeats, args.device)
            forwards = calls[0] - before
            from kvbridge.artifacts import sha256_file

            sha_ms, _ = median_ms(lambda: sha256_file(out / "kv.safetensors"), args.repeats, "cpu")
            with torch.no_grad():
                a = model(input_ids=nxt, cache=cache, use_cache=True).logits[0, -1]
                b = model(input_ids=nxt, cache=restored, use_cache=True).logits[0, -1]
            diff = float((a.float() - b.float()).abs().max())
            rows.append(
                (
                    n,
                    prefill_ms,
                    load_ms,
                    sha_ms,
                    prefill_ms / load_ms,
                    size / 1e6,
                    save_ms,
                    forwards // (args.repeats + 1),
                    diff,
                )
            )

    print(
        f"# Prefix pack load vs prefill ({args.device}, {args.dtype}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.machine()} {platform.system()})"
    )
    print()
    print(
        f"Model: Llama, 4 layers, hidden 256, 4 heads x 64, 2 KV heads, vocab 32000, {nparams / 1e6:.1f}M "
        f"parameters. Weights fingerprint (once per process, not in the load column): {wfp_ms:.0f} ms."
    )
    print()
    print(
        "| guide tokens | prefill (ms) | pack load (ms) | of which sha256 (ms) | prefill / load | "
        "kv.safetensors (MB) | save, once (ms) | forwards on load | max abs logit diff |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, p, l, s, r, mb, sv, f, d in rows:
        print(f"| {n:,} | {p:.1f} | {l:.1f} | {s:.1f} | {r:.1f}x | {mb:.1f} | {sv:.0f} | {f} | {d:.1e} |")
    return 0 if all(r[7] == 0 and r[8] == 0.0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
