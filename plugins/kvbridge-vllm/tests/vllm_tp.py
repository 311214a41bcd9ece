"""Tensor parallel size 2 on vLLM's CPU backend, with the connector (each rank loads its KV heads).

    python plugins/kvbridge-vllm/tests/vllm_tp.py --work DIR

SmolLM2-135M cannot be split over 2 ranks (9 query heads, 3 KV heads); the zoo's `base` model
(4 query heads, 2 KV heads, head dim 32) can. A 40-token prefix is exported from transformers'
cache, then vLLM (tensor_parallel_size=2) runs the prompt with the store empty (its own prefill)
and with the entry (the connector loads one KV head per rank). ``kvbridge_save`` is on: vLLM's
own prefill of the prompt is saved by both ranks (a part each, joined into one entry) and compared
with transformers' cache of the same prompt. Writes DIR/tp.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    import torch

    from kvbridge.models import load
    from kvbridge.plugins import get_host
    from kvbridge.zoo import zoo_dir
    from kvbridge_vllm import engine

    model_dir = work / "zoo-base"
    if not model_dir.is_dir():
        shutil.copytree(zoo_dir() / "base", model_dir)
    loaded = load(str(model_dir))
    ids = torch.arange(5, 45)[None]
    state = get_host().adapter_for(loaded.config).extract(loaded.model, ids)
    store, parked, events = work / "tp-store", work / "tp-parked", work / "tp-events.jsonl"
    saved = work / "tp-saved"
    for d in (store, parked, saved):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
    events.unlink(missing_ok=True)
    engine.export_state(state, str(model_dir), parked)
    entry = next(parked.iterdir())

    from vllm import LLM, SamplingParams, TokensPrompt
    from vllm.config import KVTransferConfig

    result: dict = {}
    try:
        llm = LLM(
            model=str(model_dir),
            dtype="float32",
            enforce_eager=True,
            enable_prefix_caching=False,
            tensor_parallel_size=2,
            max_model_len=256,
            kv_transfer_config=KVTransferConfig(
                kv_connector="KVBridgeConnector",
                kv_connector_module_path="kvbridge_vllm.connector",
                kv_role="kv_both",
                kv_load_failure_policy="recompute",
                kv_connector_extra_config={
                    "kvbridge_store": str(store),
                    "kvbridge_events": str(events),
                    "kvbridge_save": str(saved),
                },
            ),
        )
    except Exception as exc:  # noqa: BLE001 - the refusal is the result
        result["refused"] = f"{type(exc).__name__}: {exc}"[:2000]
    else:
        sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        prompt = TokensPrompt(prompt_token_ids=ids[0].tolist() + [50, 51, 52, 53])
        own = llm.generate([prompt], sp, use_tqdm=False)[0]
        result["saved"] = _saved(saved, model_dir, loaded, prompt["prompt_token_ids"])
        shutil.move(str(entry), store / entry.name)
        got = llm.generate([prompt], sp, use_tqdm=False)[0]
        result.update(
            own=list(own.outputs[0].token_ids),
            from_store=list(got.outputs[0].token_ids),
            cached=[own.num_cached_tokens, got.num_cached_tokens],
        )
    result["events"] = [json.loads(x) for x in events.read_text().splitlines()] if events.is_file() else []
    (work / "tp.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result)[:3000])
    return 0


def _saved(folder: Path, model_dir: Path, loaded, prompt: list) -> dict:
    """What kvbridge_save left after vLLM's own TP=2 prefill of ``prompt``: the joined entries, leftover
    parts, and the entry's largest per-layer relative error to transformers' cache of the prompt."""
    import torch

    from kvbridge.plugins import get_host
    from kvbridge_vllm import engine, store as st

    entries = sorted(p for p in folder.iterdir() if p.suffix == ".safetensors")
    out = {"entries": [p.name for p in entries], "parts": sorted(p.name for p in folder.glob(".*.part"))}
    if len(entries) == 1:
        header = st.read_entry_header(entries[0])
        got = engine.import_state(entries[0], str(model_dir))
        ref = get_host().adapter_for(loaded.config).extract(loaded.model, torch.tensor([prompt]))
        err = [float((a - b).norm() / b.norm()) for a, b in zip((*got.keys, *got.values), (*ref.keys, *ref.values))]
        out.update(
            token_ids=list(header.token_ids),
            tensor_parallel=header.manifest.get("tensor_parallel"),
            kv_shape=list(header.kv_shape),
            max_rel_err=max(err),
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
