"""vLLM continues from kvbridge's exports: the driver the vLLM integration tests run.

Run with the Python of the environment vLLM is installed in (``.venv-vllm/bin/python``)::

    python plugins/kvbridge-vllm/tests/vllm_exactness.py --work DIR [--model-dir DIR]

One vLLM engine (SmolLM2-135M-Instruct float32, enforce_eager, prefix caching off, one thread)
with the KVBridgeConnector runs every prompt three times:

1. reference: the store is empty, so vLLM prefills each prompt itself (and the connector saves
   vLLM's own prefill of each prompt, ``kvbridge_save``);
2. from kvbridge: the store holds packs (guides of 100, 128 and 250 tokens) exported with
   ``kvbridge pack export --engine vllm``, a noise control (same per-layer norms), and bad input (an
   entry for another model, a truncated file, a token mismatch);
3. from vLLM's own prefill: an entry that kvbridge imported from what the connector saved, and
   exported again.

Then transformers continues from vLLM's saved cache (round trip vLLM -> KVState -> transformers).
Writes ``DIR/result.json``; the tests (``test_vllm_integration.py``) read it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MAX_TOKENS = 32
GUIDES = {"g100": 100, "g128": 128, "g250": 250}
LIVE = "\n\nQuestion: summarise the text above in one sentence.\nAnswer:"


def corpus_ids(tok) -> list[int]:
    import argparse as a
    import json as j
    import logging as lg
    import subprocess as sp
    import unittest as ut

    text = "\n\n".join(m.__doc__.strip() for m in (a, j, lg, sp, ut))
    return tok(text, add_special_tokens=False)["input_ids"]


def read_events(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_prompts(llm, prompts: dict) -> dict:
    from vllm import SamplingParams, TokensPrompt

    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2, ignore_eos=True)
    names = list(prompts)
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=prompts[n]) for n in names], sp, use_tqdm=False)
    secs = time.perf_counter() - t0
    res = {}
    for n, o in zip(names, outs):
        c = o.outputs[0]
        steps = []
        for tok, lp in zip(c.token_ids, c.logprobs):
            ranked = sorted(lp.items(), key=lambda kv: -kv[1].logprob)
            steps.append(
                {
                    "token": int(tok),
                    "logprob": float(lp[tok].logprob),
                    "top": [[int(t), float(x.logprob)] for t, x in ranked[:2]],
                }
            )
        res[n] = {"tokens": list(c.token_ids), "steps": steps, "num_cached_tokens": o.num_cached_tokens}
    return {"outputs": res, "seconds": secs}


def compare(ref: dict, got: dict) -> dict:
    """Where two greedy runs part, and how close to a tie the reference was there."""
    a, b = ref["tokens"], got["tokens"]
    same = a == b
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    diffs = [abs(s["logprob"] - t["logprob"]) for s, t in zip(ref["steps"], got["steps"]) if s["token"] == t["token"]]
    out = {"same": same, "first_diff": first, "max_logprob_diff": max(diffs) if diffs else 0.0}
    if first is not None:
        top = ref["steps"][first]["top"]
        out["ref_margin"] = top[0][1] - top[1][1] if len(top) > 1 else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--model-dir", default=None)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    timings = {}

    import torch

    from kvbridge.models import load
    from kvbridge.prefix.packs import save_pack

    model_dir = Path(args.model_dir or work / "smollm2-hf")
    t0 = time.perf_counter()
    if not (model_dir / "model.safetensors").is_file():
        subprocess.run(
            [sys.executable, "-m", "kvbridge", "models", "materialize", "smollm2", "--out", str(model_dir)], check=True
        )
    timings["materialize_s"] = time.perf_counter() - t0

    loaded = load(str(model_dir))
    model, tok = loaded.model, loaded.tokenizer
    ids = corpus_ids(tok)
    live = tok(LIVE, add_special_tokens=False)["input_ids"]
    offsets = {"g100": 0, "g128": 150, "g250": 300, "noise": 600, "wrong": 750, "trunc": 900, "mismatch": 1050}
    sizes = {**GUIDES, "noise": 128, "wrong": 128, "trunc": 128, "mismatch": 128, "own": 160}
    offsets["own"] = 1200
    guides = {n: ids[offsets[n] : offsets[n] + sizes[n]] for n in sizes}
    assert all(len(g) == sizes[n] for n, g in guides.items()), "corpus too short"
    prompts = {n: g + live for n, g in guides.items()}
    changed = list(guides["mismatch"])
    changed[64] = (changed[64] + 1) % 1000 + 10  # one token differs in the middle
    prompts["mismatch"] = changed + live

    # packs and the store (phase 2 input), built with kvbridge before vLLM starts
    from kvbridge_vllm import engine, store as st
    from kvbridge.kvstate_io import state_from_tensors
    from kvbridge.prefix.packs import read_pack

    store_dir, save_dir = work / "store", work / "saved"
    staged = work / "staged"
    for d in (store_dir, save_dir, staged):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    t0 = time.perf_counter()
    packs = {}
    for n in ("g100", "g128", "g250", "noise", "wrong", "trunc", "mismatch"):
        packs[n] = save_pack(
            model, work / "packs" / n, guide_ids=guides[n], tokenizer=tok, model_dir=str(model_dir), overwrite=True
        )
    timings["packs_s"] = time.perf_counter() - t0
    # the CLI for one pack, the Python API for the rest
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvbridge",
            "pack",
            "export",
            str(packs["g100"]),
            "--engine",
            "vllm",
            "--model",
            str(model_dir),
            "--out",
            str(staged),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    cli_result = {"rc": cli.returncode, "stdout": cli.stdout[-2000:], "stderr": cli.stderr[-2000:]}
    ident = st.model_identity(str(model_dir))

    def state_of(name):
        manifest, tensors = read_pack(packs[name])
        return state_from_tensors(tensors, manifest["state"])

    for n in ("g128", "g250", "mismatch", "trunc"):
        engine.export_state(state_of(n), str(model_dir), staged)
    s = state_of("noise")
    gen = torch.Generator().manual_seed(0)

    def noise(t):
        r = torch.randn(t.shape, generator=gen, dtype=t.dtype)
        return r * (t.norm() / r.norm())

    from dataclasses import replace

    noisy = replace(s, keys=tuple(noise(k) for k in s.keys), values=tuple(noise(v) for v in s.values), approximate=True)
    engine.export_state(noisy, str(model_dir), staged, provenance="noise control")
    s = state_of("wrong")
    other = replace(ident, weights_digest="0" * 64, name="another-model")
    kv = torch.stack([torch.stack((k[0], v[0])) for k, v in zip(s.keys, s.values)])
    data = st.entry_bytes(kv, s.token_ids[0], other, approximate=False, provenance="another model")
    st.write_entry(data, staged, s.token_ids[0].tolist(), other)
    trunc = staged / st.entry_name(guides["trunc"], ident)
    trunc.write_bytes(trunc.read_bytes()[:-1000])

    # vLLM
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM
    from vllm.config import KVTransferConfig

    events = work / "events.jsonl"
    events.unlink(missing_ok=True)
    t0 = time.perf_counter()
    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=2048,
        seed=0,
        kv_transfer_config=KVTransferConfig(
            kv_connector="KVBridgeConnector",
            kv_connector_module_path="kvbridge_vllm.connector",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={
                "kvbridge_store": str(store_dir),
                "kvbridge_save": str(save_dir),
                "kvbridge_events": str(events),
            },
        ),
    )
    timings["llm_start_s"] = time.perf_counter() - t0

    phase1 = run_prompts(llm, prompts)
    ev1 = read_events(events)
    ref_saved = work / "saved-reference"
    shutil.rmtree(ref_saved, ignore_errors=True)
    save_dir.rename(ref_saved)
    save_dir.mkdir()

    for p in staged.iterdir():
        shutil.copy(p, store_dir / p.name)
    n_events = len(ev1)
    phase2 = run_prompts(llm, {n: prompts[n] for n in prompts if n != "own"})
    ev2 = read_events(events)[n_events:]

    # load exactness: the pages read back after the load equal the entry (first G tokens)
    load_exact = {}
    for n in ("g100", "g128", "g250"):
        e_in = st.read_entry_header(store_dir / st.entry_name(guides[n], ident))
        e_out = st.read_entry_header(save_dir / st.entry_name(prompts[n], ident))
        a = st.read_kv(e_in, start=0, stop=len(guides[n]))
        b = st.read_kv(e_out, start=0, stop=len(guides[n]))
        load_exact[n] = {"equal": bool(torch.equal(a, b)), "max_abs": float((a - b).abs().max())}

    # phase 3: vLLM's own prefill -> KVState -> store -> vLLM
    own_saved = ref_saved / st.entry_name(prompts["own"], ident)
    own_state = engine.import_state(own_saved, str(model_dir))
    guide_state = own_state.slice_tokens(0, len(guides["own"]))
    engine.export_state(guide_state, str(model_dir), store_dir, provenance="vllm-prefill (re-exported)")
    n_events = len(read_events(events))
    phase3 = run_prompts(llm, {"own": prompts["own"]})
    ev3 = read_events(events)[n_events:]
    e_out = st.read_entry_header(save_dir / st.entry_name(prompts["own"], ident))
    e_ref = st.read_entry_header(own_saved)
    a = st.read_kv(e_ref, start=0, stop=len(prompts["own"]))
    b = st.read_kv(e_out, start=0, stop=len(prompts["own"]))
    G = len(guides["own"])
    own_restore = {
        "guide_equal": bool(torch.equal(a[:, :, :, :G], b[:, :, :, :G])),
        "live_max_abs": float((a[:, :, :, G:] - b[:, :, :, G:]).abs().max()),
    }
    del llm

    # round trip: vLLM's saved cache of a whole prompt -> KVState -> transformers continues
    from kvbridge.handoff import generate
    from kvbridge.plugins import get_host

    roundtrip = {}
    for n in ("g128", "g250"):
        state = engine.import_state(ref_saved / st.entry_name(prompts[n], ident), str(model_dir))
        ids_t = torch.tensor([prompts[n]])
        own = model.generate(
            ids_t,
            max_new_tokens=MAX_TOKENS,
            min_new_tokens=MAX_TOKENS,
            do_sample=False,
            attention_mask=torch.ones_like(ids_t),
        )
        cont = generate(
            model,
            state.slice_tokens(0, len(prompts[n]) - 1),
            ids_t,
            max_new_tokens=MAX_TOKENS,
            min_new_tokens=MAX_TOKENS,
            do_sample=False,
        )
        hf = get_host().adapter_for(loaded.config).extract(model, ids_t)
        rel = [float((k - hk).norm() / hk.norm()) for k, hk in zip(state.keys, hf.keys)]
        relv = [float((v - hv).norm() / hv.norm()) for v, hv in zip(state.values, hf.values)]
        roundtrip[n] = {
            "same": own[0, ids_t.shape[1] :].tolist() == cont[0, ids_t.shape[1] :].tolist(),
            "transformers": own[0, ids_t.shape[1] :].tolist(),
            "from_vllm": cont[0, ids_t.shape[1] :].tolist(),
            "key_rel_err": rel,
            "value_rel_err": relv,
            "vllm_ref_tokens": phase1["outputs"][n]["tokens"],
        }

    result = {
        "work": str(work),
        "model_dir": str(model_dir),
        "guides": {n: len(g) for n, g in guides.items()},
        "live_tokens": len(live),
        "timings": timings,
        "phase1": phase1,
        "phase2": phase2,
        "phase3": phase3,
        "events": {"phase1": ev1, "phase2": ev2, "phase3": ev3},
        "compare": {n: compare(phase1["outputs"][n], phase2["outputs"][n]) for n in phase2["outputs"]},
        "compare_own": compare(phase1["outputs"]["own"], phase3["outputs"]["own"]),
        "load_exact": load_exact,
        "own_restore": own_restore,
        "roundtrip": roundtrip,
        "cli_export": cli_result,
        "approximate_noise": st.read_entry_header(store_dir / st.entry_name(guides["noise"], ident)).approximate,
    }
    (work / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({"ok": True, "result": str(work / "result.json"), "timings": timings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
