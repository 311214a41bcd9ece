"""vLLM: loading a stored prefix through the KVBridgeConnector vs vLLM's own prefill of it.

    python bench/bench_vllm.py [--prefix 2048] [--repeats 3] [--model-dir DIR] [--work DIR]

Runs in the vLLM environment (re-executes itself with .venv-vllm/bin/python when vLLM is not
importable; prints a skip line when that is absent: `make vllm`). SmolLM2-135M-Instruct float32,
enforce_eager, prefix caching off, one thread. For each repeat, the same prompt (a PREFIX-token
prefix + 16 live tokens, one output token) runs with the prefix's entry in the store (the
connector loads PREFIX tokens, vLLM computes 16) and without it (vLLM prefills PREFIX + 16). The
connector's own load time (its events file) is reported beside the request wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _reexec() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        py = ROOT / ".venv-vllm" / "bin" / "python"
        if not py.is_file():
            print("bench_vllm: skipped, no vLLM environment (make vllm)")
            sys.exit(0)
        os.execv(str(py), [str(py), *sys.argv])


def main() -> int:
    _reexec()
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import tempfile

    import torch

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = Path(args.model_dir or work / "smollm2-hf")
    if not (model_dir / "model.safetensors").is_file():
        subprocess.run(
            [sys.executable, "-m", "kvbridge", "models", "materialize", "smollm2", "--out", str(model_dir)], check=True
        )
    from kvbridge.models import load
    from kvbridge.plugins import get_host
    from kvbridge_vllm import engine

    torch.set_num_threads(1)
    loaded = load(str(model_dir))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (1, args.prefix + 16), generator=gen)
    t0 = time.perf_counter()
    state = get_host().adapter_for(loaded.config).extract(loaded.model, ids[:, : args.prefix])
    extract_s = time.perf_counter() - t0
    store, parked, events = work / "store", work / "parked", work / "events.jsonl"
    for d in (store, parked):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
    t0 = time.perf_counter()
    engine.export_state(state, str(model_dir), parked)
    export_s = time.perf_counter() - t0
    entry = next(parked.iterdir())
    del loaded, state

    from vllm import LLM, SamplingParams, TokensPrompt
    from vllm.config import KVTransferConfig

    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=args.prefix + 64,
        kv_transfer_config=KVTransferConfig(
            kv_connector="KVBridgeConnector",
            kv_connector_module_path="kvbridge_vllm.connector",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={"kvbridge_store": str(store), "kvbridge_events": str(events)},
        ),
    )
    sp = SamplingParams(temperature=0.0, max_tokens=1)
    prompt = TokensPrompt(prompt_token_ids=ids[0].tolist())
    llm.generate([TokensPrompt(prompt_token_ids=ids[0, :32].tolist())], sp, use_tqdm=False)  # warm-up
    rows = {"connector": [], "prefill": []}
    cached = {"connector": [], "prefill": []}
    for _ in range(args.repeats):
        for arm in ("prefill", "connector"):
            if arm == "connector":
                shutil.move(str(entry), store / entry.name)
            t0 = time.perf_counter()
            out = llm.generate([prompt], sp, use_tqdm=False)
            rows[arm].append(time.perf_counter() - t0)
            cached[arm].append(out[0].num_cached_tokens)
            if arm == "connector":
                shutil.move(str(store / entry.name), entry)
    loads = [json.loads(x) for x in events.read_text().splitlines()] if events.is_file() else []
    load_s = [e["seconds"] for e in loads if e["event"] == "loaded"]
    result = {
        "prefix_tokens": args.prefix,
        "live_tokens": 16,
        "entry_mb": entry.stat().st_size / 1e6,
        "transformers_extract_s": extract_s,
        "export_s": export_s,
        "prefill_s": statistics.median(rows["prefill"]),
        "connector_s": statistics.median(rows["connector"]),
        "connector_load_s": statistics.median(load_s) if load_s else None,
        "cached_tokens": cached,
        "repeats": args.repeats,
        "all": rows,
        "load_average": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"# bench_vllm: {args.prefix}-token prefix + 16 live tokens, 1 output token, SmolLM2-135M float32, "
        f"1 thread, medians of {args.repeats}, load average {result['load_average']:.1f}"
    )
    print("| path | request wall s | tokens vLLM computed | note |")
    print("|---|---|---|---|")
    print(f"| vLLM's own prefill | {result['prefill_s']:.2f} | {args.prefix + 16} | |")
    print(
        f"| KVBridgeConnector load | {result['connector_s']:.2f} | 16 | load itself {result['connector_load_s']:.3f} s, "
        f"entry {result['entry_mb']:.1f} MB, num_cached_tokens {cached['connector'][0]} |"
    )
    print(f"(export of the entry: {export_s:.2f} s; transformers' prefill that made it: {extract_s:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
