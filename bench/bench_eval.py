"""`kvbridge eval` cost vs the forwards an evaluation needs, on the zoo (zoo:base -> zoo:wide).

The forwards an evaluation of N samples needs, per batch of B samples (prefix P, continuation
C, G greedy tokens; K cache conditions = native + the transferred cache and its controls):

- prefills: the target over B x P tokens (native), the source over (B + 1) x P (the source
  prefixes; the shuffled control is the next sample's, so one extra row per batch);
- continuations: the target over K x B x C tokens from the K caches (teacher forcing) and
  G - 1 greedy steps of K x B tokens (greedy step 0 is the argmax of continuation position 0),
  the same without a cache (no_prefix) and the source from its own cache (source).

The "needed forwards" time runs exactly those forwards, batched, with nothing else (no metrics,
no transfers, no attention capture); eval time / needed = the overhead of the evaluation.
Both are timed alternately (median of --repeats) with --threads CPU threads, in wall and in
CPU time of this process (with one thread the CPU time is robust to a shared machine).

    python bench/bench_eval.py [--samples 32] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def needed_forwards(source, target, sad, tad, sspec, tspec, samples, cfg, k_cache: int):
    from transformers import DynamicCache

    p, c, g, bsz = cfg.prefix_len, cfg.continuation_len, cfg.greedy_tokens, cfg.batch_size
    n = samples.shape[0]
    with torch.no_grad():
        for start in range(0, n, bsz):
            ids = samples[start : start + bsz]
            b = ids.shape[0]
            prefix, cont = ids[:, :p], ids[:, p : p + c]
            nat = tad.extract(target, prefix, spec=tspec)
            src_rows = torch.cat([prefix, samples[(start + b) % n : (start + b) % n + 1, :p]])
            src = sad.extract(source, src_rows, spec=sspec)
            rows = nat.keys[0].shape[0]
            kv = [(k.repeat(k_cache, 1, 1, 1), v.repeat(k_cache, 1, 1, 1)) for k, v in zip(nat.keys, nat.values)]
            for model, cache, m in (
                (target, DynamicCache(kv), k_cache * rows),
                (target, None, rows),
                (source, DynamicCache([(k[:b].clone(), v[:b].clone()) for k, v in zip(src.keys, src.values)]), rows),
            ):
                cache = DynamicCache() if cache is None else cache
                out = model(input_ids=cont.repeat(m // rows, 1), cache=cache, use_cache=True)
                if c > 1:
                    cache.crop(-(c - 1))  # keep the prefix + continuation token 0
                tok = out.logits[:, 0].argmax(-1, keepdim=True)
                for _ in range(g - 1):
                    tok = model(input_ids=tok, cache=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-attention", action="store_true", help="evaluate without the attention-cosine capture")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from kvbridge.evaluate.conditions import CACHE_CONDITIONS, run_conditions
    from kvbridge.evaluate.settings import EvalSettings
    from kvbridge.fit.mapping import FittedMapping, LayerMap
    from kvbridge.models import load
    from kvbridge.plugins import get_host

    host = get_host()
    src, tgt = load("zoo:base", dtype="float32"), load("zoo:wide", dtype="float32")
    sad, tad = host.adapter_for(src.model.config.to_dict()), host.adapter_for(tgt.model.config.to_dict())
    sspec, tspec = sad.spec_of(src.model), tad.spec_of(tgt.model)
    g = torch.Generator().manual_seed(0)
    fs, ft = sspec.num_kv_heads * sspec.head_dim, tspec.num_kv_heads * tspec.head_dim
    k = min(4, sspec.num_layers)
    layers = [
        LayerMap(
            "dense",
            tuple(range(k)),
            torch.randn(k * fs, ft, generator=g) / (k * fs) ** 0.5,
            torch.zeros(ft),
            torch.randn(k * fs, ft, generator=g) / (k * fs) ** 0.5,
            torch.zeros(ft),
        )
        for _ in range(tspec.num_layers)
    ]
    mapping = FittedMapping(sspec, tspec, layers)
    cfg = EvalSettings(continuation_len=32, attention=not args.no_attention)  # C=32: the runs BENCHMARKS.md records
    samples = torch.randint(0, tspec.vocab_size, (args.samples, cfg.sample_len), generator=g)
    runs = {
        "eval": lambda: run_conditions(src.model, tgt.model, mapping, samples, cfg, host=host),
        "needed forwards": lambda: needed_forwards(
            src.model, tgt.model, sad, tad, sspec, tspec, samples, cfg, len(CACHE_CONDITIONS)
        ),
    }
    times = {key: [] for key in runs}
    cpu = {key: [] for key in runs}
    for fn in runs.values():
        fn()  # warm-up
    for _ in range(args.repeats):
        for key, fn in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[key].append(time.perf_counter() - t0)
            cpu[key].append(time.process_time() - c0)
    med = {key: statistics.median(v) for key, v in times.items()}
    medc = {key: statistics.median(v) for key, v in cpu.items()}
    p, c, gt, b = cfg.prefix_len, cfg.continuation_len, cfg.greedy_tokens, cfg.batch_size
    print(
        f"# bench_eval: zoo:base -> zoo:wide, {args.samples} samples, P={p} C={c} G={gt} B={b}, "
        f"attention capture {'off' if args.no_attention else 'on'}, {torch.get_num_threads()} thread(s), "
        f"load average {os.getloadavg()[0]:.1f}, torch {torch.__version__}\n"
    )
    print("| run | median wall s | vs needed forwards | median CPU s | vs needed forwards (CPU) |")
    print("|---|---:|---:|---:|---:|")
    for key, v in med.items():
        print(
            f"| {key} | {v:.3f} | {v / med['needed forwards']:.2f}x | {medc[key]:.3f} | "
            f"{medc[key] / medc['needed forwards']:.2f}x |"
        )


if __name__ == "__main__":
    main()
