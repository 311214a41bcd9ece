"""The cross-model path through vLLM: Qwen2.5-Coder 0.5B (transformers) -> a fitted mapping -> the 1.5B in vLLM.

    python bench/bench_vllm_pair.py --run /work/runs/fit31-qwen --mapping map-k4-a0.01 \\
        --target-dir /work/runs/vllm32-qwen15-hf [--samples 16] [--out results.json]

Runs in the vLLM environment (re-executes itself with .venv-vllm/bin/python when vLLM is not
importable; `make vllm` first). ``--target-dir`` is the safetensors folder vLLM serves; when it holds
no weights it is written first (``kvbridge models materialize TARGET --out DIR``, float32 from the
GGUF the mapping was fitted on). The samples are drawn as ``bench/bench_llamacpp_pair.py`` draws
them (RESULTS.md, "The cross-model path on a real engine"): the held-out files of the run's corpus,
``--samples`` windows of prefix + continuation + 1 tokens, scored on the continuation's real next
tokens by teacher forcing:

- **native**: vLLM runs the 1.5B on prefix + continuation itself (its own prefill); the log-probs
  of each continuation position come from vLLM's prompt log-probs (full vocabulary);
- **transferred**: transformers' 0.5B (float32) prefills the prefix, the mapping moves its cache to
  the 1.5B's geometry (RoPE stripped and re-applied), ``kvbridge_vllm.engine.export_state`` writes
  it as a store entry (marked approximate), and vLLM, serving the 1.5B with the KVBridgeConnector,
  loads it and computes only the continuation (no 1.5B prefill of the prefix);
- **source alone**: the 0.5B in transformers (float32) on prefix + continuation (what a user gets
  by not transferring at all);
- **no prefix**: vLLM's 1.5B on the continuation alone.

Also per sample: 8 greedy tokens after prefix + continuation (transferred and source alone against
native's), and the time of vLLM's own prefill of the prefix (+1 token, one output token) against the
same request loading the transferred entry (plus the connector's own load time from its events).
Gap recovered = (NLL_no_prefix - NLL_x) / (NLL_no_prefix - NLL_native) with a 95% paired bootstrap
interval over samples; top-1 = share of positions whose argmax equals native's; KL(native || x)
per position. The 0.5B is freed before vLLM starts: the two never hold memory at the same time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("KVBRIDGE_HOME", Path.home() / ".cache/kvbridge")) / "models"
SOURCE = MODELS / "qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
TARGET = MODELS / "qwen2.5-coder-1.5b-instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
GREEDY = 8


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _reexec() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        py = ROOT / ".venv-vllm" / "bin" / "python"
        if not py.is_file():
            print("bench_vllm_pair: skipped, no vLLM environment (make vllm)")
            sys.exit(0)
        os.execv(str(py), [str(py), *sys.argv])


def dense_rows(flat, positions: list[int], vocab: int) -> np.ndarray:
    """Full-vocabulary log-prob rows of a request's prompt log-probs (vLLM ``FlatLogprobs``) at
    ``positions`` (position i: the distribution of prompt token i given the tokens before it)."""
    out = np.full((len(positions), vocab), -np.inf, dtype=np.float64)
    for r, pos in enumerate(positions):
        s, e = flat.start_indices[pos], flat.end_indices[pos]
        ids = np.asarray(flat.token_ids[s:e], dtype=np.int64)
        out[r, ids] = np.asarray(flat.logprobs[s:e], dtype=np.float64)
    if not np.isfinite(out).all():
        raise RuntimeError("vLLM returned fewer log-probs than the vocabulary (prompt_logprobs=-1, max_logprobs=-1)")
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def summarize(per: dict, targets: np.ndarray, rng: np.random.Generator, n_boot: int) -> dict:
    nll = {c: -np.take_along_axis(lp, targets[..., None], -1)[..., 0].mean(-1) for c, lp in per.items()}
    native = per["native"]
    boot = rng.integers(0, len(targets), size=(n_boot, len(targets)))
    out = {}
    for c, lp in per.items():
        gap = (nll["no_prefix"].mean() - nll[c].mean()) / (nll["no_prefix"].mean() - nll["native"].mean())
        g = [
            (nll["no_prefix"][b].mean() - nll[c][b].mean()) / (nll["no_prefix"][b].mean() - nll["native"][b].mean())
            for b in boot
        ]
        kl = (np.exp(native) * (native - lp)).sum(-1)
        out[c] = {
            "nll": float(nll[c].mean()),
            "gap_recovered": float(gap),
            "gap_ci": [float(np.quantile(g, 0.025)), float(np.quantile(g, 0.975))],
            "top1_agreement": float((lp.argmax(-1) == native.argmax(-1)).mean()),
            "kl_mean": float(kl.mean()),
            "kl_p95": float(np.quantile(kl, 0.95)),
        }
    return out


def source_phase(args, rows: np.ndarray, parked: Path) -> dict:
    """The source's part, in a child process that exits before vLLM starts (its memory is returned):
    per sample the transferred store entry (parked, one folder per sample), the source's own
    log-probs and greedy tokens, and the times."""
    import multiprocessing

    out = parked / "source.npz"
    child = multiprocessing.get_context("spawn").Process(target=_source_child, args=(vars(args), rows, parked, out))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise SystemExit(f"the source phase failed (exit {child.exitcode})")
    with np.load(out) as z:
        res = {k: z[k] for k in z.files}
    res["lp"] = list(res["lp"].astype(np.float64))
    res["greedy"] = res["greedy"].tolist()
    return res


def _source_child(params: dict, rows: np.ndarray, parked: Path, out: Path) -> None:
    import torch

    torch.set_num_threads(params["threads"])
    res = _source_work(argparse.Namespace(**params), rows, parked)
    np.savez(
        out,
        lp=np.stack(res["lp"]).astype(np.float32),
        greedy=np.asarray(res["greedy"], dtype=np.int64),
        **{k: np.asarray(res[k]) for k in ("source_prefill_s", "map_s", "export_s", "entry_bytes")},
    )


def _source_work(args, rows: np.ndarray, parked: Path) -> dict:
    import torch

    from kvbridge.fit.artifact import load_mapping
    from kvbridge.models import load
    from kvbridge.plugins import get_host
    from kvbridge.transfer import transfer
    from kvbridge_vllm import engine

    host = get_host()
    P, C = args.prefix_len, args.continuation_len
    t0 = time.perf_counter()
    src = load(str(args.source), dtype="float32", host=host)
    smodel, tok = src.model.eval(), src.tokenizer
    log(f"loaded the source in transformers in {time.perf_counter() - t0:.1f} s")
    mapping = load_mapping(args.mapping, source=smodel, host=host)  # the target is not loaded in transformers
    sad = host.adapter_for(smodel.config.to_dict())
    res = {"lp": [], "greedy": [], "source_prefill_s": [], "map_s": [], "export_s": [], "entry_bytes": []}
    for i, row in enumerate(rows.tolist()):
        prefix = row[:P]
        with torch.no_grad():
            t0 = time.perf_counter()
            state = sad.extract(smodel, torch.tensor([prefix]))
            t1 = time.perf_counter()
            moved = transfer(state, mapping, host=host)
            t2 = time.perf_counter()
        assert moved.approximate, "a transferred cache must be marked approximate"
        data = engine.export_state(
            moved, str(args.target_dir), parked / f"s{i}", dtype=args.dtype, provenance="transferred (bench)"
        )
        t3 = time.perf_counter()
        for k, v in zip(("source_prefill_s", "map_s", "export_s"), (t1 - t0, t2 - t1, t3 - t2)):
            res[k].append(v)
        res["entry_bytes"].append(len(data))
        with torch.no_grad():
            logits = smodel(input_ids=torch.tensor([row[: P + C]])).logits[0, P : P + C].float().numpy()
            gen = smodel.generate(
                input_ids=torch.tensor([row[: P + C + 1]]),
                attention_mask=torch.ones(1, P + C + 1, dtype=torch.long),
                max_new_tokens=GREEDY,
                min_new_tokens=GREEDY,
                do_sample=False,
                pad_token_id=tok.eos_token_id or 0,
            )
        res["lp"].append(log_softmax(logits))
        res["greedy"].append(gen[0, P + C + 1 :].tolist())
        log(f"source {i + 1}/{len(rows)}: prefill {t1 - t0:.2f} s, map {t2 - t1:.3f} s, export {t3 - t2:.3f} s")
    return res


def _available_mib() -> int:
    with open("/proc/meminfo") as fh:
        return next((int(x.split()[1]) // 1024 for x in fh if x.startswith("MemAvailable:")), 1 << 20)


class RssWatch:
    """The largest summed resident memory of this process and its descendants (vLLM's engine and
    worker), sampled every second in a thread, from when it is created; the run is stopped (exit 3,
    vLLM's processes killed) when the machine has had under BENCH_MIN_AVAILABLE_MIB (600) MiB available
    for 3 s."""

    def __init__(self) -> None:
        import threading

        self.peak = 0
        self.floor_mib = int(os.environ.get("BENCH_MIN_AVAILABLE_MIB", "600"))
        threading.Thread(target=self._run, daemon=True).start()

    def _pids(self) -> list[int]:
        todo, seen = [os.getpid()], []
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.append(pid)
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as fh:
                    todo += [int(x) for x in fh.read().split()]
            except OSError:
                continue
        return seen

    def _sum(self) -> int:
        total = 0
        for pid in self._pids():
            try:
                with open(f"/proc/{pid}/status") as fh:
                    total += next((int(x.split()[1]) for x in fh if x.startswith("VmRSS:")), 0) * 1024
            except OSError:
                continue
        return total

    def _run(self) -> None:
        low = 0
        while True:
            self.peak = max(self.peak, self._sum())
            low = low + 1 if _available_mib() < self.floor_mib else 0
            if low >= 3:  # the machine is shared: stop this run before the kernel kills someone's job
                log(
                    f"aborting: under {self.floor_mib} MiB available for 3 s (this run holds {self.peak_gib():.1f} GiB)"
                )
                for pid in self._pids()[1:]:
                    try:
                        os.kill(pid, 9)
                    except OSError:
                        pass
                os._exit(3)
            time.sleep(1)

    def peak_gib(self) -> float:
        return self.peak / 2**30


def main(argv=None) -> int:
    _reexec()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--run", type=Path, default=None, help="a bench_pair / fit run folder (results.json names the corpus)"
    )
    ap.add_argument("--corpus", type=Path, default=None, help="the corpus (default: the run's)")
    ap.add_argument("--mapping", default="map-k4-a0.01", help="mapping folder (a name inside --run, or a path)")
    ap.add_argument("--source", default=str(SOURCE), help="source model reference (transformers)")
    ap.add_argument("--target", default=str(TARGET), help="target model reference to materialize from")
    ap.add_argument("--target-dir", type=Path, required=True, help="the safetensors folder vLLM serves")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=64)
    ap.add_argument("--continuation-len", type=int, default=8)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kv-space-gib", default="1", help="VLLM_CPU_KVCACHE_SPACE (whole GiB)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="vLLM's model and cache dtype")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (store, events)")
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    args = ap.parse_args(argv)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_space_gib)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if args.threads == 1 else f"0-{args.threads - 1}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process (memory)
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")  # vLLM's worker returns the weights' load buffers
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", "67108864")
    mapping = Path(args.mapping)
    if args.run is not None and not mapping.is_absolute() and not mapping.exists():
        mapping = args.run / args.mapping
    args.mapping = mapping
    import tempfile

    import torch

    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    if not any(args.target_dir.glob("*.safetensors")):
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "kvbridge", "models", "materialize", args.target, "--out", str(args.target_dir)]
        subprocess.run(cmd, check=True)
        log(f"materialized {args.target} in {time.perf_counter() - t0:.1f} s")
    from kvbridge.evaluate import corpus_samples
    from kvbridge.evaluate.corpus import eval_corpus
    from kvbridge.models import resolve
    from kvbridge.models.loading import load_tokenizer_of

    tok = load_tokenizer_of(resolve(args.source))
    run = json.loads((args.run / "results.json").read_text()) if args.run else None
    corpus = args.corpus or Path(run["corpus"]["path"])
    manifest = json.loads((args.mapping / "manifest.json").read_text())
    ev = eval_corpus(corpus, manifest, 0.1, explicit=False, allow=False, tokenizer=tok)
    P, C = args.prefix_len, args.continuation_len
    length = P + C + 1
    ids, data = corpus_samples([ev.tail], tok, n=args.samples, length=length, fraction=1.0)
    if run is not None:
        assert data["heldout_tokens"] == run["eval_data"]["heldout_tokens"], "not the run's held-out text"
    rows = ids.numpy()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-vllm-pair-"))
    store, parked, events = work / "store", work / "parked", work / "events.jsonl"
    for d in (store, parked):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    events.unlink(missing_ok=True)
    src = source_phase(args, rows, parked)

    from vllm import LLM, SamplingParams, TokensPrompt
    from vllm.config import KVTransferConfig

    rss = RssWatch()
    t0 = time.perf_counter()
    llm = LLM(
        model=str(args.target_dir),
        dtype=args.dtype,
        enforce_eager=True,
        enable_prefix_caching=False,
        max_num_seqs=1,
        distributed_executor_backend="uni",  # the worker in the engine's process: one copy of the runtime
        max_model_len=max(256, length + GREEDY + 8),
        max_logprobs=-1,
        kv_transfer_config=KVTransferConfig(
            kv_connector="KVBridgeConnector",
            kv_connector_module_path="kvbridge_vllm.connector",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={"kvbridge_store": str(store), "kvbridge_events": str(events)},
        ),
    )
    engine_start_s = time.perf_counter() - t0
    log(f"vLLM started in {engine_start_s:.1f} s")
    # vLLM skips reading any cached prefix (its own and a connector's) for a request that asks for prompt
    # log-probs unless told otherwise: the rows of loaded positions are then not computed, and only the
    # continuation's rows (computed after the load) are read below
    scored = SamplingParams(
        temperature=0.0,
        max_tokens=GREEDY,
        prompt_logprobs=-1,
        flat_logprobs=True,
        detokenize=False,
        ignore_eos=True,
        skip_reading_prefix_cache=False,
    )
    timed = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    vocab = int(src["lp"][0].shape[-1])

    def request(tokens, sp, entry: Path | None = None):
        if entry is not None:
            shutil.move(str(entry), store / entry.name)
        try:
            t = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=list(tokens))], sp, use_tqdm=False)[0]
            return out, time.perf_counter() - t
        finally:
            if entry is not None:
                shutil.move(str(store / entry.name), entry)

    llm.generate([TokensPrompt(prompt_token_ids=rows[0, :16].tolist())], timed, use_tqdm=False)  # warm-up
    per = {c: [] for c in ("native", "transferred", "no_prefix")}
    greedy = {c: [] for c in ("native", "transferred")}
    timing = {"target_prefill_s": [], "connector_request_s": []}
    cached = {"transferred": [], "native": []}
    for i, row in enumerate(rows.tolist()):
        (entry,) = (parked / f"s{i}").iterdir()
        want = list(range(P + 1, P + C + 1))  # prompt positions predicting the continuation's next tokens
        out, _ = request(row, scored)
        per["native"].append(dense_rows(out.prompt_logprobs, want, vocab))
        greedy["native"].append(list(out.outputs[0].token_ids))
        cached["native"].append(out.num_cached_tokens)
        out, _ = request(row, scored, entry)
        per["transferred"].append(dense_rows(out.prompt_logprobs, want, vocab))
        greedy["transferred"].append(list(out.outputs[0].token_ids))
        cached["transferred"].append(out.num_cached_tokens)
        out, _ = request(row[P:], scored)
        per["no_prefix"].append(dense_rows(out.prompt_logprobs, list(range(1, C + 1)), vocab))
        _, t_native = request(row[: P + 1], timed)
        _, t_conn = request(row[: P + 1], timed, entry)
        timing["target_prefill_s"].append(t_native)
        timing["connector_request_s"].append(t_conn)
        log(
            f"vLLM {i + 1}/{len(rows)}: prefill {t_native:.2f} s vs connector {t_conn:.2f} s, rss {rss.peak_gib():.1f} GiB"
        )
        if args.out and i + 1 < len(rows):  # a run stopped early still leaves its first samples' numbers
            part = results(args, rows, per, greedy, src, timing, cached, events, rss, engine_start_s, t_start)
            args.out.write_text(json.dumps(part, indent=1))
    out = results(args, rows, per, greedy, src, timing, cached, events, rss, engine_start_s, t_start, complete=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    print(report(out))
    return 0


def results(args, rows, per, greedy, src, timing, cached, events, rss, engine_start_s, t_start, *, complete=False):
    """The results dict over the samples vLLM has scored so far (all of them when ``complete``)."""
    import torch
    import vllm

    import kvbridge

    n = len(per["native"])
    P, C = args.prefix_len, args.continuation_len
    per = {**{c: v[:n] for c, v in per.items()}, "source_alone": src["lp"][:n]}
    targets = rows[:n, P + 1 : P + C + 1]
    boot = args.bootstrap if complete else min(args.bootstrap, 200)
    res = summarize({c: np.stack(v) for c, v in per.items()}, targets, np.random.default_rng(0), boot)
    loads = [json.loads(x) for x in events.read_text().splitlines()] if events.is_file() else []
    load_s = [e["seconds"] for e in loads if e.get("event") == "loaded"]
    refused = [e for e in loads if e.get("event") == "refused"]

    def agree(a, b):
        return sum(int(x == y) for x, y in zip(a, b))

    def first_split(a, b):
        return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    greedy_res = {
        c: {
            "equal_tokens": sum(agree(g, m) for g, m in zip(gs, greedy["native"])),
            "of": GREEDY * n,
            "identical_samples": sum(int(g == m) for g, m in zip(gs, greedy["native"])),
            "mean_first_split": float(np.mean([first_split(g, m) for g, m in zip(gs, greedy["native"])])),
        }
        for c, gs in (("transferred", greedy["transferred"]), ("source_alone", src["greedy"][:n]))
    }
    out = {
        "argv": sys.argv[1:],
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "kvbridge": kvbridge.__version__,
        "machine": platform.machine(),
        "threads": args.threads,
        "dtype": args.dtype,
        "source": str(args.source),
        "mapping": str(args.mapping),
        "target_dir": str(args.target_dir),
        "samples": n,
        "complete": complete,
        "prefix_len": P,
        "continuation_len": C,
        "conditions": res,
        "greedy": greedy_res,
        "greedy_tokens": GREEDY,
        "num_cached_tokens": cached,
        "connector_refused": len(refused),
        "timing_median_ms": {
            **{k: round(1e3 * float(np.median(src[k])), 1) for k in ("source_prefill_s", "map_s", "export_s")},
            **{k: round(1e3 * float(np.median(v)), 1) for k, v in timing.items()},
            "connector_load_s": round(1e3 * float(np.median(load_s)), 2) if load_s else None,
        },
        "entry_bytes": int(np.median(src["entry_bytes"])),
        "engine_start_s": round(engine_start_s, 1),
        "peak_rss_gib_vllm_and_bench": round(rss.peak_gib(), 2),
        "load_average": os.getloadavg()[0],
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    return out


def report(r: dict) -> str:
    names = {
        "native": "target native (vLLM's own prefill)",
        "source_alone": "**source alone** (transformers)",
        "transferred": "transferred source -> target (loaded into vLLM through the connector)",
        "no_prefix": "no prefix (target in vLLM)",
    }
    lines = [
        f"{r['samples']} samples{'' if r.get('complete', True) else ' (run stopped early: these are its first samples)'}, prefix {r['prefix_len']}, continuation {r['continuation_len']}, "
        f"source {Path(r['source']).name}, target {Path(r['target_dir']).name}, mapping {Path(r['mapping']).name}, "
        f"vLLM {r['vllm']} (CPU, {r.get('dtype', 'float32')}), {r['threads']} thread(s)",
        "",
        "| condition | NLL | gap recovered [95% CI] | top-1 vs native | KL mean | KL p95 | greedy tokens = native |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in ("native", "source_alone", "transferred", "no_prefix"):
        x = r["conditions"][c]
        g = r["greedy"].get(c)
        greedy = f"{g['equal_tokens']}/{g['of']}" if g else ("-" if c == "no_prefix" else "(reference)")
        lines.append(
            f"| {names[c]} | {x['nll']:.3f} | {x['gap_recovered']:.3f} [{x['gap_ci'][0]:.3f}, "
            f"{x['gap_ci'][1]:.3f}] | {x['top1_agreement']:.3f} | {x['kl_mean']:.3f} | {x['kl_p95']:.3f} | {greedy} |"
        )
    t = r["timing_median_ms"]
    lines += [
        "",
        f"medians per sample: vLLM prefill of the prefix (+1 token) {t['target_prefill_s']} ms vs the same request "
        f"loading the transferred entry {t['connector_request_s']} ms (connector load {t['connector_load_s']} ms); "
        f"source transformers prefill {t['source_prefill_s']} ms, mapping {t['map_s']} ms, export {t['export_s']} ms; "
        f"num_cached_tokens (transferred) {sorted(set(r['num_cached_tokens']['transferred']))}, refused "
        f"{r['connector_refused']}; vLLM start {r['engine_start_s']} s; wall {r['wall_s']} s",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
