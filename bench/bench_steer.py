"""KV steering measured: behaviours of SmolLM2-135M-Instruct, and a vector moved across zoo models.

    python bench/bench_steer.py smollm2 --behaviours json,bullets,negative,comments \
        [--samples 32 --tokens 40 --sweep 0.5,1,2,4 --sweep-samples 16] [--json out.json] [--png-dir DIR]
    python bench/bench_steer.py zoo [--samples 64 --tokens 32 --sweep 0.5,1,2,4] [--json out.json]
    python bench/bench_steer.py qwen --mapping DIR [--behaviours comments --samples 16 --tokens 48] [--json out.json]

``smollm2``: per behaviour, a steering vector is built from contrastive pairs that differ only by
the behaviour's instruction (positive: a system turn holding the instruction + a user question;
negative: the same question under the template's default system turn), read at the last cached
position (the ``assistant`` token of the generation prompt), 24 questions none of which is the
evaluation prompt. Then ``kvbridge.steer.evaluate`` runs the arms none / visible instruction /
instruction in a pack / KV vector / activation addition / random direction of equal norm on one
held-out prompt, same seeds in every arm, and a coefficient sweep (kv, actadd, random).

``zoo``: the cross-model transfer. A vector is built on ``base`` from Shakespeare-style pairs
(loving vs deadly lines, read at the last cached position), a mapping ``base -> TARGET`` is fitted
(calibration text sampled from ``base``, ridge, top-k 2) and the vector moved through it
(``kvbridge.steer.vectors.transfer_vector``). On each target (``tuned``: a fine-tune of base;
``stranger``: same recipe, another seed) the arms are: none, the target's native vector (built
on the target from the same pairs), the transferred vector, the base vector copied unmapped
(identity: same geometry), a random direction with the native vector's norms, and activation
addition with the native residual directions; behaviour = ``positive_sentiment``.

``qwen``: the real family pair. Per behaviour, a vector is built on Qwen2.5-Coder-0.5B-Instruct
from the same chat pairs as ``smollm2`` (instruction in the system turn vs the template's default
system turn), and moved to Qwen2.5-Coder-1.5B-Instruct through a fitted mapping (``--mapping``,
a ``kvbridge fit`` folder for 0.5B -> 1.5B, e.g. bench/bench_pair.py's map-k4-a0.01). On the 0.5B
the arms are none / visible instruction / KV vector / random; on the 1.5B none / visible
instruction / its native vector (built on the 1.5B from the same pairs) / the transferred vector /
random. Both models load dequantized in float32 (about 9 GB together).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

QUESTIONS = [
    "What is the capital of France?",
    "How do plants make food?",
    "Tell me about elephants.",
    "Why is the sky blue?",
    "What is a good way to learn a language?",
    "Explain what a computer does.",
    "What do bees do?",
    "Describe the ocean.",
    "How does a bicycle work?",
    "What is rain?",
    "Tell me about the planet Mars.",
    "What is music?",
    "How do I make tea?",
    "What is friendship?",
    "Describe a forest.",
    "What are stars made of?",
    "How do birds fly?",
    "What is a volcano?",
    "Tell me about trains.",
    "What is the internet?",
    "How do fish breathe?",
    "What is chocolate made from?",
    "Describe winter.",
    "What is a library?",
]

BEHAVIOURS = {
    "json": {
        "scorer": "json_start",
        "instruction": "Always answer with a JSON object only, no other text.",
        "prompt": "Describe your favourite animal.",
        "ck": 0.0,
        "cv": 4.0,
        "ca": 4.0,
    },
    "bullets": {
        "scorer": "bullets",
        "instruction": "Always answer as a bulleted list: every line starts with '- '.",
        "prompt": "What should I know about the moon?",
        "ck": 0.0,
        "cv": 4.0,
        "ca": 4.0,
    },
    "negative": {
        "scorer": "negative_sentiment",
        "instruction": "You are grumpy and negative. Complain: everything is bad, awful and boring.",
        "prompt": "Write a short review of a restaurant you visited.",
        "ck": 0.0,
        "cv": 4.0,
        "ca": 4.0,
    },
    "comments": {
        "scorer": "code_comments",
        "instruction": "Always put a # comment on every line of code you write.",
        "prompt": "Write a Python function that reverses a string.",
        "ck": 0.0,
        "cv": 4.0,
        "ca": 4.0,
    },
}

NAMES = ["ROMEO", "JULIET", "KING RICHARD", "QUEEN", "GLOUCESTER", "DUKE", "NURSE", "FRIAR"]
LOVING = [
    "my sweet love, fair and gentle",
    "O joy, my dear and noble love",
    "good and gentle peace be with you",
    "thy kind and lovely heart is dear to me",
    "sweet joy and merry love are mine",
]
DEADLY = [
    "blood and death, kill and curse",
    "O woe, foul villain and murder",
    "war and evil fear be with you",
    "thy cruel and bloody hand is death to me",
    "grief and woe and bloody war are mine",
]


def smollm2_pairs(instruction: str) -> list:
    from kvbridge.steer.pairs import Pair

    return [Pair((("system", instruction), ("user", q)), (("user", q),), i + 1) for i, q in enumerate(QUESTIONS)]


def zoo_pairs() -> list:
    from kvbridge.steer.pairs import Pair

    out = []
    for i, name in enumerate(NAMES):
        for j, (a, b) in enumerate(zip(LOVING, DEADLY)):
            if (i + j) % 2 == 0:
                out.append(Pair(f"{name}:\n[[{a}]]", f"{name}:\n[[{b}]]", len(out) + 1))
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_smollm2(args) -> dict:
    import torch

    from kvbridge.models import load
    from kvbridge.steer.evaluate import evaluate, plot_sweep
    from kvbridge.steer.settings import SteerEvalSettings
    from kvbridge.plugins import get_host
    from kvbridge.steer.vectors import build_vector

    torch.set_num_threads(args.threads)
    lm = load("smollm2")
    model, tok = lm.model, lm.tokenizer
    out = {}
    for name in args.behaviours.split(","):
        b = BEHAVIOURS[name]
        t0 = time.perf_counter()
        vector = build_vector(model, tok, smollm2_pairs(b["instruction"]))
        log(f"[{name}] vector from {len(QUESTIONS)} pairs in {time.perf_counter() - t0:.0f} s")
        settings = SteerEvalSettings(
            vector=f"smollm2-{name}",
            prompt=b["prompt"],
            scorer=b["scorer"],
            instruction=b["instruction"],
            samples=args.samples,
            max_new_tokens=args.tokens,
            ck=b["ck"] * args.scale,
            cv=b["cv"] * args.scale,
            ca=b["ca"] * args.ca_scale,
            layers=args.layers,
            arms=tuple(args.arms.split(",")),
            sweep=tuple(float(x) for x in args.sweep.split(",") if x),
            sweep_samples=args.sweep_samples,
        )
        res = evaluate(
            model,
            tok,
            vector,
            scorer=get_host().get("scorer", b["scorer"]),
            settings=settings,
            log=lambda m, n=name: log(f"[{n}] {m}"),
        )
        res["behaviour"] = name
        res["vector"]["norms_mean"] = {
            k: sum(map(sum, v)) / sum(map(len, v)) for k, v in vector.norms().items() if k != "residual"
        }
        if args.png_dir:
            Path(args.png_dir).mkdir(parents=True, exist_ok=True)
            plot_sweep(res, Path(args.png_dir) / f"steer-smollm2-{name}.png", title=f"SmolLM2-135M-Instruct: {name}")
        out[name] = res
    return out


def run_zoo(args) -> dict:
    import torch

    from kvbridge.fit import fit
    from kvbridge.steer.evaluate import evaluate, plot_sweep
    from kvbridge.steer.settings import SteerEvalSettings
    from kvbridge.plugins import get_host
    from kvbridge.steer.vectors import build_vector, transfer_vector
    from kvbridge.transfer import IdentityMapping
    from kvbridge.zoo.load import load_zoo_model

    torch.set_num_threads(args.threads)
    base, tok = load_zoo_model("base")
    pairs = zoo_pairs()
    v_base = build_vector(base, tok, pairs, position=args.position)
    torch.manual_seed(0)
    start = tok("\n", return_tensors="pt").input_ids.repeat(32, 1)
    texts = tok.batch_decode(base.generate(start, do_sample=True, top_k=40, max_new_tokens=64))
    out = {}
    for target_name in args.targets.split(","):
        target, _ = load_zoo_model(target_name)
        t0 = time.perf_counter()
        mapping = fit(base, target, texts, tokenizer=tok, seq_len=64, top_k=2, stride=2)
        r2 = mapping.report.r2_summary
        log(
            f"[{target_name}] mapping base->{target_name}: held-out R2 mean {r2.get('mean'):.3f} "
            f"({time.perf_counter() - t0:.0f} s)"
        )
        native = build_vector(target, tok, pairs, position=args.position)
        moved = transfer_vector(v_base, mapping)
        copied = transfer_vector(v_base, IdentityMapping(), native.spec)

        def cos(a, b):
            import torch.nn.functional as F

            return float(
                F.cosine_similarity(torch.cat([x.reshape(-1) for x in a]), torch.cat([x.reshape(-1) for x in b]), dim=0)
            )

        settings = SteerEvalSettings(
            vector=f"{target_name}-native",
            prompt=args.prompt,
            scorer="positive_sentiment",
            samples=args.samples,
            max_new_tokens=args.tokens,
            ck=0.0,
            cv=args.cv,
            ca=args.ca,
            layers=args.layers,
            chat=False,
            at=args.at,
            arms=("none", "kv", "transferred", "copied", "random", "actadd"),
            sweep=tuple(float(x) for x in args.sweep.split(",") if x),
            sweep_samples=args.sweep_samples,
            sweep_arms=("kv", "transferred", "copied", "random"),
        )
        res = evaluate(
            target,
            tok,
            native,
            scorer=get_host().get("scorer", "positive_sentiment"),
            settings=settings,
            extra_vectors={"transferred": moved, "copied": copied},
            log=lambda m, n=target_name: log(f"[{n}] {m}"),
        )
        res["mapping"] = {
            "fitter": "ridge",
            "top_k": 2,
            "calibration": "32 x 64 tokens sampled from base",
            "heldout_r2": r2,
        }
        res["cosine_to_native"] = {
            "transferred_v": cos(moved.values, native.values),
            "transferred_k": cos(moved.keys, native.keys),
            "copied_v": cos(copied.values, native.values),
            "copied_k": cos(copied.keys, native.keys),
        }
        log(f"[{target_name}] cosine to native: {res['cosine_to_native']}")
        if args.png_dir:
            Path(args.png_dir).mkdir(parents=True, exist_ok=True)
            plot_sweep(
                res,
                Path(args.png_dir) / f"steer-zoo-base-to-{target_name}.png",
                title=f"zoo base -> {target_name}: positive_sentiment",
            )
        out[target_name] = res
    return out


def run_qwen(args) -> dict:
    import torch

    from kvbridge.fit.artifact import load_mapping
    from kvbridge.models import load
    from kvbridge.steer.evaluate import evaluate
    from kvbridge.steer.settings import SteerEvalSettings
    from kvbridge.plugins import get_host
    from kvbridge.steer.vectors import build_vector, transfer_vector

    if args.mapping is None:
        raise SystemExit("qwen needs --mapping DIR (a kvbridge fit folder for the 0.5B -> 1.5B pair)")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    small, big = load("qwen2.5-coder-0.5b", dtype="float32"), load("qwen2.5-coder-1.5b", dtype="float32")
    log(f"loaded both models in {time.perf_counter() - t0:.0f} s")
    mapping = load_mapping(args.mapping, source=small.model, target=big.model)
    out = {}

    def cos(a, b):
        import torch.nn.functional as F

        return float(
            F.cosine_similarity(torch.cat([x.reshape(-1) for x in a]), torch.cat([x.reshape(-1) for x in b]), dim=0)
        )

    for name in args.behaviours.split(","):
        b = BEHAVIOURS[name]
        pairs = smollm2_pairs(b["instruction"])
        v_small = build_vector(small.model, small.tokenizer, pairs)
        v_big = build_vector(big.model, big.tokenizer, pairs)
        moved = transfer_vector(v_small, mapping)
        common = dict(
            samples=args.samples,
            max_new_tokens=args.tokens,
            ck=b["ck"] * args.scale,
            cv=b["cv"] * args.scale,
            ca=b["ca"] * args.ca_scale,
            layers=args.layers,
            sweep=tuple(float(x) for x in args.sweep.split(",") if x),
            sweep_samples=args.sweep_samples,
        )
        for label, lm, vector, arms, extra in (
            ("0.5b", small, v_small, ("none", "visible", "kv", "random"), None),
            ("1.5b", big, v_big, ("none", "visible", "kv", "transferred", "random"), {"transferred": moved}),
        ):
            t1 = time.perf_counter()
            settings = SteerEvalSettings(
                vector=f"{label}-{name}",
                prompt=b["prompt"],
                scorer=b["scorer"],
                instruction=b["instruction"],
                **common,
                arms=arms,
                sweep_arms=tuple(a for a in ("kv", "transferred", "random") if a in arms),
            )
            res = evaluate(
                lm.model,
                lm.tokenizer,
                vector,
                scorer=get_host().get("scorer", b["scorer"]),
                settings=settings,
                extra_vectors=extra,
                log=lambda m, n=f"{name} {label}": log(f"[{n}] {m}"),
            )
            res["behaviour"], res["model"] = name, label
            if extra:
                res["mapping"] = {"dir": str(args.mapping), "heldout_r2": (mapping.manifest or {}).get("r2_summary")}
                res["cosine_to_native"] = {
                    "transferred_v": cos(moved.values, v_big.values),
                    "transferred_k": cos(moved.keys, v_big.keys),
                }
                log(f"[{name}] cosine to the 1.5B's native vector: {res['cosine_to_native']}")
            log(f"[{name} {label}] {time.perf_counter() - t1:.0f} s")
            out[f"{name} {label}"] = res
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["smollm2", "zoo", "qwen"])
    ap.add_argument("--mapping", type=Path, default=None, help="qwen: the 0.5B -> 1.5B mapping folder")
    ap.add_argument("--behaviours", default="json,bullets,negative,comments")
    ap.add_argument("--targets", default="tuned,stranger")
    ap.add_argument("--arms", default="none,visible,pack,kv,actadd,random")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--sweep", default="0.5,1,2,4")
    ap.add_argument("--sweep-samples", type=int, default=16)
    ap.add_argument("--layers", default="all")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every behaviour's ck/cv")
    ap.add_argument("--ca-scale", type=float, default=1.0, help="multiply every behaviour's ca")
    ap.add_argument("--cv", type=float, default=4.0, help="zoo: value coefficient")
    ap.add_argument("--ca", type=float, default=2.0, help="zoo: actadd coefficient")
    ap.add_argument("--prompt", default="ROMEO:\n", help="zoo: the evaluation prompt")
    ap.add_argument(
        "--position",
        default="last",
        choices=["last", "final", "span"],
        help="zoo: where pairs are read (span: the mean over each line)",
    )
    ap.add_argument(
        "--at",
        default="last",
        choices=["last", "prompt"],
        help="zoo: kv arms edit the last cached position or every prompt position",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png-dir", type=Path)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    results = {"smollm2": run_smollm2, "zoo": run_zoo, "qwen": run_qwen}[args.what](args)
    from kvbridge.steer.evaluate import lines

    for name, res in results.items():
        print(f"\n### {args.what}: {name}\n")
        print("\n".join(lines(res)))
    payload = {
        "what": args.what,
        "results": results,
        "seconds": round(time.perf_counter() - t0, 1),
        "command": "python bench/bench_steer.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    if args.json:
        args.json.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
    log(f"done in {payload['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
