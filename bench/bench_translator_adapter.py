"""The ``translator`` fitter on the real adapter pair: SmolLM2-135M -> SmolLM2 + the shipped Shakespeare
LoRA (issue 31), against its own ridge start and plain reuse, on the same held-out windows.

The calibration and evaluation text are RESULTS.md's adapter-pair run's (``kvbridge.adapters.pair``:
calibration from the corpus front, samples from the corpus tail); the translator's ridge options
default to that run's (top-k 1, stride 4). Prints a markdown table; ``--json FILE`` keeps the results.

    nice python bench/bench_translator_adapter.py --calibration-tokens 4096 --samples 24 -o steps=200
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration-tokens", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--prefix-len", type=int, default=64)
    ap.add_argument("--continuation-len", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("-o", dest="options", action="append", default=[], help="translator option key=value")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from kvbridge.adapters import load_adapter_pair
    from kvbridge.adapters.pair import calibration_ids
    from kvbridge.adapters import DEFAULT_CORPUS
    from kvbridge.evaluate import corpus_samples, evaluate
    from kvbridge.evaluate.settings import EvalSettings
    from kvbridge.fit import fit
    from kvbridge.fit.mapping import FittedMapping
    from kvbridge.fit.protocol import parse_pairs
    from kvbridge.transfer import IdentityMapping

    t0 = time.perf_counter()
    pair = load_adapter_pair()
    base, tuned, tok = pair.base, pair.tuned, pair.tokenizer
    text = DEFAULT_CORPUS.read_text(encoding="utf-8")
    calib = calibration_ids(tok, text, args.calibration_tokens)
    opts = {"top_k": "1", **parse_pairs(args.options)}
    t1 = time.perf_counter()
    mapping = fit(base, tuned, calib, fitter="translator", options=opts, stride=4, seed=0, distributed=None)
    fit_s = time.perf_counter() - t1
    ridge = FittedMapping(mapping.source_spec, mapping.target_spec, mapping.layers, fitter="ridge")
    ids, data = corpus_samples(DEFAULT_CORPUS, tok, n=args.samples, length=args.prefix_len + args.continuation_len + 1)
    cfg = EvalSettings(
        prefix_len=args.prefix_len,
        continuation_len=args.continuation_len,
        greedy_tokens=1,
        batch_size=8,
        seed=0,
        conditions=("native", "transferred", "no_prefix"),
    )
    out = {"argv": sys.argv[1:], "fit_s": round(fit_s, 1), "training": mapping.report.training, "rows": {}}
    for name, m in (("plain reuse", IdentityMapping()), ("ridge", ridge), ("translator", mapping)):
        res = evaluate(base, tuned, m, ids, config=cfg, data=data)
        c = res["conditions"]["transferred"]
        out["rows"][name] = {
            k: c.get(k)
            for k in ("nll", "gap_recovered", "gap_recovered_ci", "kl_mean", "kl_p95", "attention_cosine_min")
        }
        out["rows"][name]["attention_cosine_mean"] = (
            sum(c["attention_cosine_layers"]) / len(c["attention_cosine_layers"])
            if c.get("attention_cosine_layers")
            else None
        )
        out["native_nll"] = res["conditions"]["native"]["nll"]
        out["no_prefix_nll"] = res["conditions"]["no_prefix"]["nll"]
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    tr = mapping.report.training
    print("| row | NLL | gap recovered [95% CI] | KL mean | KL p95 | attn cos mean | attn cos min |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| native | {out['native_nll']:.3f} | 1 | 0 | 0 | 1 | 1 |")
    for name, r in out["rows"].items():
        ci = r["gap_recovered_ci"] or [float("nan")] * 2
        print(
            f"| {name} | {r['nll']:.3f} | {r['gap_recovered']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | {r['kl_mean']:.4f} "
            f"| {r['kl_p95']:.3f} | {r['attention_cosine_mean']:.3f} | {r['attention_cosine_min']:.3f} |"
        )
    print(f"| no prefix | {out['no_prefix_nll']:.3f} | 0 | | | | |")
    print(
        f"\ntraining: train {tr['before']['train']['loss']:.4f} -> {tr['after']['train']['loss']:.4f}, held-out "
        f"{tr['before']['heldout']['loss']:.4f} -> {tr['after']['heldout']['loss']:.4f} (cosine "
        f"{tr['before']['heldout']['attention_cosine_mean']:.4f} -> {tr['after']['heldout']['attention_cosine_mean']:.4f}); "
        f"collect {tr['collect_seconds']} s, {tr['steps']}+{tr['kl_steps']} steps in {tr['train_seconds']} s; "
        f"fit {out['fit_s']} s; wall {out['wall_s']} s"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
