"""Seconds per ``translator`` training step at a pair's sizes, on random data (no models loaded).

The step (forward and backward of every layer's residual and attention over the stored queries)
does not depend on the values, only on the sizes: sequences per step, sequence length, target
layers / KV heads / query heads / head dim, the features (top-k x source KV heads x source head
dim), the query positions and the rank. Defaults: Qwen2.5-Coder 0.5B -> 1.5B, top-k 4.

    python bench/bench_translator_step.py --threads 2 --batch 1,2 --repeat 3
"""

from __future__ import annotations

import argparse
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--q-heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--features", type=int, default=4 * 2 * 64)
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batch", default="1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    import torch

    from kvbridge.fit.translator_data import TrainingData, layer_losses

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    sizes = [int(b) for b in args.batch.split(",")]
    n, t, lt, ht, d, hq, q, f = (
        max(sizes),
        args.seq_len,
        args.layers,
        args.kv_heads,
        args.head_dim,
        args.q_heads,
        args.queries,
        args.features,
    )

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    data = TrainingData(
        x={"k": rnd(n, lt, t, f), "v": rnd(n, lt, t, f)},
        base={"k": rnd(n, lt, ht, t, d), "v": rnd(n, lt, ht, t, d)},
        q=rnd(n, lt, hq, q, d),
        ref=rnd(n, lt, hq, q, d),
        qpos=torch.linspace(t // 8, t - 1, q).long(),
        mask=torch.ones(lt, q, t, dtype=torch.bool).tril(t - q),
        scaling=torch.full((lt,), d**-0.5),
        softcap=None,
        rope=(torch.ones(lt, t, d), torch.zeros(lt, t, d), d, False),
        held=torch.zeros(n, dtype=torch.bool),
        ids=torch.zeros(n, t, dtype=torch.long),
    )
    params = {
        c: {"a": rnd(lt, f, args.rank).requires_grad_(), "b": torch.zeros(lt, args.rank, ht * d, requires_grad=True)}
        for c in "kv"
    }
    for b in sizes:
        rows = torch.arange(b)
        layer_losses(data, params, "lowrank", rows).mean().backward()  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.repeat):
            layer_losses(data, params, "lowrank", rows).mean().backward()
        secs = (time.perf_counter() - t0) / args.repeat
        print(f"batch {b} x {t} tokens: {secs:.2f} s per step ({1000 * secs / (b * t):.2f} s per 1k tokens trained)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
