"""Graft a chunk prepared alone after other context, on a real model: naive vs token-selective recompute.

    nice -n 10 python bench/bench_recompute_graft.py --model smollm2 --out docs/recompute
    python bench/bench_recompute_graft.py --model zoo:base --samples 16          # quick, the zoo

Two data sets, each ``context | chunk | continuation`` with the same token counts per sample:

- ``passages``: contiguous held-out windows of the corpus (the last 10% of tinyshakespeare): a
  passage (context) then the next passage (the chunk, prepared alone) then the text after it;
- ``question``: a question, then a retrieved passage (prepared alone) holding the answer among
  distractor facts, then ``Answer: ...`` (synthetic facts from fixed word lists, seed 0; the
  samples kept are those whose three parts have the most common token counts).

Conditions and metrics: :func:`kvbridge.recompute.graft.run_graft` (full prefill = ceiling, chunk
dropped = floor, naive graft, blend@R with the CacheBlend rule, random@R, no_reposition, shuffled).
Writes ``graft_<data>.{json,md,png}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

FIRST = [
    "Mara",
    "Tobias",
    "Elena",
    "Jonah",
    "Priya",
    "Oskar",
    "Lena",
    "Felix",
    "Nadia",
    "Hugo",
    "Ines",
    "Ravi",
    "Clara",
    "Milo",
    "Sofia",
    "Anton",
    "Yara",
    "Emil",
    "Zoe",
    "Bruno",
]
LAST = ["Quill", "Hart", "Moss", "Vale", "Stone", "Reed", "Frost", "Lark", "Wells", "Cole", "Park", "Shaw"]
CITIES = [
    "Lisbon",
    "Oslo",
    "Cairo",
    "Lima",
    "Dublin",
    "Kyoto",
    "Quito",
    "Perth",
    "Nairobi",
    "Vienna",
    "Hanoi",
    "Denver",
    "Madrid",
    "Prague",
    "Seoul",
    "Boston",
]
JOBS = ["baker", "pilot", "nurse", "farmer", "teacher", "painter", "chemist", "sailor", "tailor", "judge"]
PETS = ["cat", "dog", "parrot", "goat", "rabbit", "horse", "turtle", "hamster"]
COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white", "grey", "pink"]


def fact_samples(tok, n: int, seed: int = 0, candidates: int = 4000):
    import torch

    rng = random.Random(seed)
    rows = []
    for _ in range(candidates):
        people = rng.sample([(f, l) for f in FIRST for l in LAST], 3)
        facts = []
        for f, l in people:
            city, job, pet, col = rng.choice(CITIES), rng.choice(JOBS), rng.choice(PETS), rng.choice(COLOURS)
            facts.append((f, l, city, job, pet, col))
        who = facts[0]
        kind = rng.choice(["city", "job", "pet"])
        question = {
            "city": f"In which city does {who[0]} {who[1]} live?",
            "job": f"What is the job of {who[0]} {who[1]}?",
            "pet": f"Which animal does {who[0]} {who[1]} keep?",
        }[kind]
        answer = {
            "city": f"{who[0]} {who[1]} lives in {who[2]}.",
            "job": f"{who[0]} {who[1]} works as a {who[3]}.",
            "pet": f"{who[0]} {who[1]} keeps a {who[4]}.",
        }[kind]
        order = facts[:]
        rng.shuffle(order)
        passage = " ".join(
            f"{f} {l} lives in {c} and works as a {j}. {f} keeps a {p} and likes the colour {co}."
            for f, l, c, j, p, co in order
        )
        ctx = tok(f"Question: {question}\nPassage:", add_special_tokens=True)["input_ids"]
        chk = tok(" " + passage, add_special_tokens=False)["input_ids"]
        cont = tok(f"\nAnswer: {answer}", add_special_tokens=False)["input_ids"]
        rows.append((ctx, chk, cont))
    buckets: dict = {}
    for r in rows:
        buckets.setdefault(tuple(len(x) for x in r), []).append(r)
    best = max(buckets.values(), key=len)[:n]
    if len(best) < n:
        print(f"note: only {len(best)} question samples share one length triple", file=sys.stderr)
    return tuple(torch.tensor([r[i] for r in best]) for i in range(3))


def passage_samples(tok, corpus: Path, n: int, c: int, k: int, cont: int):
    import torch

    from kvbridge.evaluate import heldout_text, windows
    from kvbridge.fit.calibrate import load_corpus

    texts, _ = load_corpus(corpus)
    stream = torch.tensor(tok(heldout_text(texts), add_special_tokens=False)["input_ids"], dtype=torch.long)
    ids = windows(stream, n, c + k + cont + 1)
    return ids[:, :c], ids[:, c : c + k], ids[:, c + k :]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--corpus", default=None, help="default: the zoo's corpus (../shared/corpora/tinyshakespeare.txt)")
    ap.add_argument("--data", default="question,passages")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--context-len", type=int, default=96)
    ap.add_argument("--chunk-len", type=int, default=96)
    ap.add_argument("--continuation-len", type=int, default=16)
    ap.add_argument("--ratios", default="0.05,0.1,0.15,0.3,1.0")
    ap.add_argument("--check-layer", type=int, default=1)
    ap.add_argument("--controls", default="random,no_reposition,shuffled")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from kvbridge.recompute import report
    from kvbridge.models import load
    from kvbridge.recompute.graft import run_graft

    t0 = time.perf_counter()
    loaded = load(args.model)
    model, tok, name = loaded.model, loaded.tokenizer, loaded.name
    print(
        f"# {name}: {model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, "
        f"loaded in {time.perf_counter() - t0:.1f} s; torch threads {args.threads}",
        flush=True,
    )
    ratios = [float(x) for x in args.ratios.split(",")]
    for data in args.data.split(","):
        if data == "question":
            ctx, chk, cont = fact_samples(tok, args.samples)
        else:
            from kvbridge.demo.zoo import find_corpus

            ctx, chk, cont = passage_samples(
                tok, find_corpus(args.corpus), args.samples, args.context_len, args.chunk_len, args.continuation_len
            )
        t0 = time.perf_counter()
        res = run_graft(
            model,
            ctx,
            chk,
            cont,
            ratios=ratios,
            check_layer=args.check_layer,
            controls=tuple(args.controls.split(",")),
            batch_size=args.batch_size,
            bootstrap=args.bootstrap,
        )
        res.update(model=name, data=data, seconds=time.perf_counter() - t0)
        print(
            f"\n## {data}: {res['samples']} samples, context {res['context_len']} + chunk {res['chunk_len']} tokens, "
            f"{res['continuation_len']} scored; full prefill {res['timing']['full_prefill_ms']:.0f} ms in all; "
            f"run {res['seconds']:.0f} s\n",
            flush=True,
        )
        print(report.table(res), flush=True)
        if args.out:
            report.write(res, args.out, f"graft_{data}", f"graft on {name}: {data}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
