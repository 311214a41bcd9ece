"""Transfer time of a translator mapping against its own ridge part (the same layers, no residual).

python bench/bench_translator_latency.py zoo:base zoo:odd MAPPING_DIR --samples 16 --prefix-len 64
"""

from __future__ import annotations

import argparse
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("target")
    ap.add_argument("mapping")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    import torch

    from kvbridge.fit.artifact import load_mapping
    from kvbridge.fit.mapping import FittedMapping
    from kvbridge.models import load
    from kvbridge.plugins import get_host
    from kvbridge.transfer import transfer

    torch.set_num_threads(args.threads)
    host = get_host()
    src, tgt = load(args.source), load(args.target)
    mapping = load_mapping(args.mapping, source=src.model, target=tgt.model)
    ridge = FittedMapping(mapping.source_spec, mapping.target_spec, mapping.layers, fitter="ridge")
    ids = torch.randint(0, 200, (args.samples, args.prefix_len), generator=torch.Generator().manual_seed(0))
    state = host.adapter_of(src.model).extract(src.model, ids)
    spec = host.adapter_of(tgt.model).spec_of(tgt.model)
    for name, m in (("ridge part", ridge), (mapping.fitter, mapping)):
        transfer(state, m, spec, host=host)  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.repeat):
            transfer(state, m, spec, host=host)
        ms = (time.perf_counter() - t0) / args.repeat * 1000
        print(f"{name}: {ms:.1f} ms for {args.samples * args.prefix_len} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
