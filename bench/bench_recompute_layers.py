"""Layer- and token-selective recompute of a transferred cache: the quality/cost curve of a pair.

    nice -n 10 python bench/bench_recompute_layers.py --out docs/recompute            # zoo base->stranger
    nice -n 10 python bench/bench_recompute_layers.py --source smollm2 \\
        --target-adapter src/kvbridge/adapters/smollm2-shakespeare --mapping identity --name smollm2-shakespeare \\
        --max-share 0.15 --tokens 0.05,0.15,0.3 --out docs/recompute

Zoo pair (default): ``base -> stranger`` with (a) the ridge mapping fitted exactly as the demo fits it
(``kvbridge demo``: top-k 4, stride 4, the first 32,768 tokens of the corpus's base split) and (b) the
unfitted reuse (``identity``). Evaluation: 64 windows of the corpus's held-out tail, prefix 64,
continuation 8 (the demo's samples). Layer choice for the curve: the greedy group search on 16
calibration windows from the corpus front (never the evaluation tail), both recompute modes
(``target``: the target's own forward up to the last recomputed layer; ``source``: the source's
hidden states at each group entry), plus ``prefix@K`` (layers 0..K-1, the cheapest K layers in target
mode); the single-layer profile is printed too. Token points: the
CacheBlend rule on the transferred prefix. Writes ``layers_<name>_<mapping>_<mode>.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import time


def lora_target(source, adapter_dir: str):
    """A copy of ``source`` with the LoRA adapter merged into its weights (``kvbridge.adapters``, no peft)."""
    from kvbridge.adapters import load_with_adapter

    return load_with_adapter(source, adapter_dir).eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="zoo:base")
    ap.add_argument("--target", default="zoo:stranger")
    ap.add_argument(
        "--target-adapter",
        default=None,
        help="a LoRA adapter folder: the target is the source with it merged (a fine-tune pair)",
    )
    ap.add_argument("--mapping", default="fit,identity", help="fit, identity, or a mapping folder (comma list)")
    ap.add_argument("--name", default="base-stranger")
    ap.add_argument("--corpus", default=None)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--calibration-samples", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=64)
    ap.add_argument("--continuation-len", type=int, default=8)
    ap.add_argument("--modes", default="target,source")
    ap.add_argument("--max-share", type=float, default=1.0, help="greedy sweep up to this share of layers")
    ap.add_argument("--tokens", default="0.05,0.15,0.3,0.5,1.0")
    ap.add_argument("--fit-tokens", type=int, default=32768)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from kvbridge.demo.zoo import calibration_ids, eval_ids, find_corpus
    from kvbridge.evaluate.run import mapping_of
    from kvbridge.plugins import get_host
    from kvbridge.recompute import report
    from kvbridge.models import load
    from kvbridge.evaluate.settings import EvalSettings, RecomputeSettings
    from kvbridge.recompute.curve import layer_sweep, run_curve
    from kvbridge.recompute.settings import CurvePlan
    from kvbridge.run import model_run
    from kvbridge.recompute.layers import calibration, profile_layers

    host = get_host()
    corpus = find_corpus(args.corpus)
    if corpus is None:
        raise SystemExit("no corpus found: pass --corpus ../shared/corpora/tinyshakespeare.txt")
    loaded = load(args.source)
    source, tok = loaded.model, loaded.tokenizer
    if args.target_adapter:
        target = lora_target(source, args.target_adapter)
        args.target = f"{args.source}+{args.target_adapter}"
    else:
        target = load(args.target, tokenizer=False).model
    n_layers = target.config.num_hidden_layers
    length = args.prefix_len + args.continuation_len + 1
    ids, _ = eval_ids(corpus, tok, {}, args.samples, length)
    cal_rows = calibration_ids(corpus, tok, {}, max(args.fit_tokens, 128 * args.calibration_samples))
    print(
        f"# {args.source} -> {args.target}: {n_layers} target layers; {args.samples} held-out samples, prefix "
        f"{args.prefix_len}, continuation {args.continuation_len}; torch threads {args.threads}",
        flush=True,
    )
    for mref in args.mapping.split(","):
        t0 = time.perf_counter()
        run = model_run(source, target, EvalSettings(mapping=mref, corpus=str(corpus)), host)
        if mref == "fit":
            from kvbridge.fit import fit

            mapping = fit(
                source,
                target,
                cal_rows[: args.fit_tokens // 128],
                top_k=4,
                stride=4,
                seed=0,
                host=host,
                distributed=None,
                out=None,
                overwrite=True,
            )
        else:
            mapping = mapping_of(run)
        # selection calibration: the last rows of the calibration block, cut to sample length (never the eval tail)
        cal = cal_rows[-args.calibration_samples :, :length]
        calib = calibration(source, target, mapping, cal, args.prefix_len, args.continuation_len, host=host)
        prof = profile_layers(target, calib, host=host)
        print(
            f"\n## mapping {mref} (ready in {time.perf_counter() - t0:.1f} s)\nsingle-layer loss (KL when only "
            "that layer comes from the mapping): " + ", ".join(f"L{i} {x:.4f}" for i, x in enumerate(prof)),
            flush=True,
        )
        pts = layer_sweep(target, calib, max_share=args.max_share, host=host)
        steps = pts[0][2].get("greedy_steps") or []
        print("greedy steps: " + "; ".join(f"{s['layers']} loss {s['loss']:.4f}" for s in steps), flush=True)
        prefix_pts = layer_sweep(target, calib, max_share=args.max_share, method="prefix", host=host)
        for mode in args.modes.split(","):
            t0 = time.perf_counter()
            mode_pts = pts + (prefix_pts[:-1] if mode == "target" else [])
            toks = [float(x) for x in args.tokens.split(",")] if mode == "target" and args.tokens else []
            settings = EvalSettings(
                mapping=mref,
                corpus=str(corpus),
                prefix_len=args.prefix_len,
                continuation_len=args.continuation_len,
                batch_size=args.batch_size,
                bootstrap=args.bootstrap,
                recompute=RecomputeSettings(mode=mode),
            )
            plan = CurvePlan(layer_points=tuple(mode_pts), token_ratios=tuple(toks))
            res = run_curve(run.with_settings(settings), mapping, ids, plan)
            res.update(pair=f"{args.source}->{args.target}", mapping=mref, single_layer_loss=prof, greedy_steps=steps)
            print(f"\n### mapping {mref}, mode {mode} ({time.perf_counter() - t0:.0f} s)\n", flush=True)
            print(report.table(res), flush=True)
            if args.out:
                report.write(
                    res,
                    args.out,
                    f"layers_{args.name}_{mref if mref in ('fit', 'identity') else 'map'}_{mode}",
                    f"{args.source} -> {args.target}, mapping {mref}, recompute mode {mode}",
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
