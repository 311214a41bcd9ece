"""Prefix-pack restore vs prefill of the same guide on the real SmolLM2 (the serving case).

    python bench/bench_pack_real.py                         # guides of 16, 512, 2048 tokens
    python bench/bench_pack_real.py --lengths 16,64 --repeats 11 --threads 1

SmolLM2-135M-Instruct (``smollm2``, fetched by ``kvbridge models fetch smollm2``), float32, already
loaded with its tokenizer, torch pinned to ``--threads`` (default 1). For each guide length the
same token ids are (a) prefilled into a fresh ``DynamicCache`` (``logits_to_keep=1``: what a server
pays without a pack) and (b) restored from a pack saved once: ``load_pack(folder, model,
tokenizer=...)`` (manifest and checksum, model/tokenizer/weights identity checks, KV state) plus
``pack.cache(model)`` (the injected cache). The model's identity is memoised on the loaded model, so
from the second restore on it costs a walk over its tensor slots, not a re-hash; the first restore's
time (which hashes the weights once) is reported on its own. Medians of ``--repeats`` runs after one
warm-up, the two measured alternately in one process. The last column checks that the next-token
logits after the restored cache equal (bitwise) those after the prefill.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="16,512,2048")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args(argv)

    import torch
    import transformers
    from transformers import DynamicCache

    from kvbridge.models import load
    from kvbridge.models.fingerprint import forget_weights_fingerprint
    from kvbridge.prefix.packs import load_pack, save_pack

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    lm = load(args.model)
    model, tok = lm.model, lm.tokenizer
    gen = torch.Generator().manual_seed(0)
    print(
        f"# {args.model} float32, torch {torch.__version__}, {args.threads} thread(s), {platform.machine()}, "
        f"medians of {args.repeats}, load average {os.getloadavg()[0]:.2f} at the start"
    )
    print(
        "| guide tokens | prefill ms | pack restore ms | speed-up | first restore ms (hashes weights) | "
        "next-token logits equal |"
    )
    print("|---:|---:|---:|---:|---:|:---:|")
    with tempfile.TemporaryDirectory(prefix="kvbridge-bench-") as tmp:
        for n in [int(x) for x in args.lengths.split(",") if x.strip()]:
            ids = torch.randint(100, len(tok) - 100, (1, n), generator=gen)
            folder = f"{tmp}/pack-{n}"
            save_pack(model, folder, guide_ids=ids[0].tolist(), tokenizer=tok)

            def prefill():
                with torch.no_grad():
                    cache = DynamicCache(config=model.config)
                    model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
                return cache

            def restore():
                return load_pack(folder, model, tokenizer=tok).cache(model)

            forget_weights_fingerprint(model)
            t0 = time.perf_counter()
            restore()
            first = (time.perf_counter() - t0) * 1e3
            prefill()
            tp, tr = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                a = prefill()
                tp.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                b = restore()
                tr.append((time.perf_counter() - t0) * 1e3)
            nxt = torch.tensor([[int(tok.eos_token_id or 0)]])
            with torch.no_grad():
                la = model(input_ids=nxt, cache=a, use_cache=True).logits
                lb = model(input_ids=nxt, cache=b, use_cache=True).logits
            p, r = statistics.median(tp), statistics.median(tr)
            print(
                f"| {n} | {p:.1f} | {r:.1f} | {p / r:.1f}x | {first:.0f} | {'yes' if torch.equal(la, lb) else 'NO'} |"
            )
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
