"""The compute frontier (``kvbridge eval --frontier``) on the real adapter pair: SmolLM2 -> SmolLM2 + LoRA.

The base model's cache is given to base+adapter as it is (identity mapping: plain reuse, the
fine-tune case), on held-out windows of the corpus tail (the same split as
``python -m kvbridge.adapters.pair``); the adapter pair is not a model reference the CLI loads,
so this script calls :func:`kvbridge.recompute.frontier.run_frontier` itself::

    PYTHONPATH=src python bench/bench_frontier_adapter.py --samples 16 --prefix-len 512 \\
        --frontier 0.1,0.25,0.5 --out /work/runs/frontier-adapter.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=None, help="text file (default: the adapter's tinyshakespeare)")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--continuation-len", type=int, default=8)
    ap.add_argument("--frontier", default="0.1,0.25,0.5")
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON result file")
    args = ap.parse_args(argv)

    import torch

    from kvbridge.adapters import load_adapter_pair
    from kvbridge.adapters import DEFAULT_CORPUS
    from kvbridge.evaluate import corpus_samples
    from kvbridge.evaluate.settings import EvalSettings
    from kvbridge.recompute.frontier import run_frontier
    from kvbridge.recompute.frontier_report import table
    from kvbridge.run import model_run
    from kvbridge.transfer import IdentityMapping

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    pair = load_adapter_pair()
    corpus = Path(args.corpus or DEFAULT_CORPUS)
    ids, data = corpus_samples(
        corpus, pair.tokenizer, n=args.samples, length=args.prefix_len + args.continuation_len + 1
    )
    settings = EvalSettings(
        mapping="identity",
        corpus=str(corpus),
        prefix_len=args.prefix_len,
        continuation_len=args.continuation_len,
        frontier=args.frontier,
        sink=args.sink,
        batch_size=args.batch_size,
        bootstrap=args.bootstrap,
    )
    result = run_frontier(
        model_run(pair.base, pair.tuned, settings),
        IdentityMapping(),
        ids,
        progress=lambda done, total: print(
            f"{done}/{total} samples, {time.perf_counter() - t0:.0f} s", file=sys.stderr
        ),
    )
    result.update(
        source=pair.base_name,
        target=f"{pair.base_name}+{Path(pair.adapter.path).name}",
        mapping="identity (plain reuse)",
        data=data,
        wall_seconds=time.perf_counter() - t0,
        command="python bench/bench_frontier_adapter.py " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    print(table(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
