"""kvbridge's caches in a real inference engine: llama.cpp (llama-cpp-python 0.3.36) on SmolLM2's GGUF.

    python bench/bench_llamacpp.py                      # all five parts, lengths 128,512,2048
    python bench/bench_llamacpp.py --lengths 64 --repeats 3

SmolLM2-135M-Instruct (``smollm2``, the Q4_1 GGUF): transformers runs it dequantized to float32,
llama.cpp runs the GGUF itself (F16 KV cache, flash attention off, one thread unless ``--threads``;
torch pinned to the same count). Parts (the functions are :mod:`tools.llamacpp_check`,
which the tests in tests/real/test_llamacpp_engine.py call too):

1. continuation: transformers' cache of ``prompt[:-1]`` exported (``export_state``), loaded into
   llama.cpp, the last prompt token decoded, 8 greedy tokens, against llama.cpp's own prefill of
   the prompt: tokens, first-step max |logit| difference, and the model's own noise (transformers
   float32 logits vs llama.cpp's on the same prompt); the F16 rounding bound (transformers itself
   continuing from the export's F16-rounded cache vs its float32 cache: what the export's one
   rounding costs, with no llama.cpp kernel involved); also the same with the layout permutation
   switched off (what a wrong rotary layout costs);
2. import: llama.cpp's cache of a prompt read back (``import_state``) vs transformers' cache, per
   layer relative error, and transformers continuing from it (kvbridge's hand-off);
3. pack: a SmolLM2 prefix pack (a long system prompt) exported and loaded into llama.cpp, the live
   turn decoded, vs llama.cpp prefilling guide + live; the guide prefill time saved;
4. speed per token: export (KVState -> file bytes), llama.cpp load, llama.cpp save, import (file
   bytes -> KVState) against llama.cpp's prefill, at ``--lengths`` tokens; medians of ``--repeats``;
5. round trip llama.cpp -> KVState -> llama.cpp (``roundtrip_check``): the re-exported file equals
   llama.cpp's own byte for byte, and llama.cpp continues from it bitwise.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nThe capital of France is",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy",
    "One, two, three, four, five, six, seven, eight,",
]
GUIDE = (
    "You are a careful technical assistant for a team that maintains a Python library for moving the "
    "attention caches of transformer language models between models and inference engines. Answer in short "
    "paragraphs. When you give code, give complete functions with type hints and a docstring, and say which "
    "Python versions it needs. When a question is ambiguous, state the reading you chose in one sentence "
    "before answering. Never invent an API: if you are not sure a function exists, say so and show how to "
    "check. Prefer the standard library; when a dependency is needed, name the package and the smallest "
    "version that has the feature. Keep numbers honest: every measurement you quote must come with the "
    "command that produced it, the machine it ran on and how many repetitions were taken. If the user asks "
    "for a benchmark, measure medians of several runs after a warm-up, report the spread, and never compare "
    "numbers taken on different machines. Start every answer with a one-line summary."
)
LIVE = "What does a KV cache hold, in one sentence?"


def _median(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def f16_rounding_effect(lm, state, ids, target, host) -> float:
    """Max |logit| of transformers' first step from ``state`` (the cache of ``ids[:-1]``) vs from the
    same cache exported to llama.cpp's F16 file and read back: the export's rounding alone."""
    import numpy as np
    import torch

    from kvbridge.engines import llamacpp as L
    from kvbridge.handoff import generate

    rounded = L.import_state(L.export_state(state, target, host=host), target, host=host)
    x = torch.tensor([ids])
    gen = dict(
        max_new_tokens=1,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        attention_mask=torch.ones_like(x),
        pad_token_id=0,
    )
    with torch.no_grad():
        a = generate(lm.model, state, x, host=host, **gen).logits[0][0].float().numpy()
        b = generate(lm.model, rounded, x, host=host, **gen).logits[0][0].float().numpy()
    return float(np.abs(a.astype(np.float64) - b).max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's tools/ (the checks)
    from kvbridge.engines import llamacpp as L
    from tools.llamacpp_check import continuation_check, import_check, pack_check, roundtrip_check
    from kvbridge.engines.llamacpp_runtime import LlamaCppSession, binding_version
    from kvbridge.models import load
    from kvbridge.plugins import get_host
    from kvbridge.prefix.packs import guide_ids_of, save_pack

    torch.set_num_threads(args.threads)
    lm = load("smollm2")
    tok = lm.tokenizer
    gguf = lm.ref.gguf_file
    host = get_host()
    print(
        f"llama-cpp-python {binding_version()}, torch {torch.__version__}, {platform.processor() or platform.machine()}"
        f", {args.threads} thread(s), load average {os.getloadavg()[0]:.1f} at start"
    )
    lengths = [int(x) for x in args.lengths.split(",")]
    session = LlamaCppSession(gguf, n_ctx=max(2048, *lengths) + 16, n_batch=512, n_threads=args.threads)
    target = L.engine_model(gguf, host=host)
    adapter = host.adapter_for(lm.model.config.to_dict())

    print("\n## 1. llama.cpp continuing from kvbridge's export (8 greedy tokens)\n")
    print(
        "| prompt tokens | tokens equal (all 8) | compared before a near tie | first-step max abs logit diff "
        "| model's own noise (transformers vs llama.cpp) | F16 rounding alone (transformers) "
        "| without the layout permutation |"
    )
    print("|---|---|---|---|---|---|---|")
    for p in PROMPTS:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        r = continuation_check(lm, session, ids, new_tokens=8, host=host)
        saved = L.ENGINE_INTERLEAVED["llama"]
        L.ENGINE_INTERLEAVED["llama"] = False
        try:
            wrong = continuation_check(lm, session, ids, new_tokens=2, host=host)
        finally:
            L.ENGINE_INTERLEAVED["llama"] = saved
        with torch.no_grad():
            state = adapter.extract(lm.model, torch.tensor([ids[:-1]]))
        f16 = f16_rounding_effect(lm, state, ids, target, host)
        print(
            f"| {len(ids)} | {r.ours_tokens == r.native_tokens} | {r.compared}/8 | {r.first_step_diff:.3f} | "
            f"{r.noise:.3f} | {f16:.4f} | {wrong.first_step_diff:.2f} |"
        )

    print("\n## 2. llama.cpp's cache read back (import) vs transformers' cache\n")
    print(
        "| prompt tokens | K rel. err layer 0 / median / max | V rel. err layer 0 / median / max | K without "
        "the permutation (layer 1) | transformers from the import: tokens equal (all 8) | first-step diff / noise |"
    )
    print("|---|---|---|---|---|---|")
    for p in PROMPTS[:2]:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        r = import_check(lm, session, ids, new_tokens=8, host=host)
        k, v = r.key_rel_err, r.value_rel_err
        print(
            f"| {len(ids)} | {k[0]:.4f} / {statistics.median(k):.4f} / {max(k):.4f} | {v[0]:.4f} / "
            f"{statistics.median(v):.4f} / {max(v):.4f} | {r.key_rel_err_unpermuted:.3f} | "
            f"{r.handoff_tokens == r.hf_tokens} | {r.first_step_diff:.3f} / {r.noise:.3f} |"
        )

    print("\n## 3. A SmolLM2 pack restored into llama.cpp (no llama.cpp prefill of the guide)\n")
    guide = tok.apply_chat_template([{"role": "system", "content": GUIDE}], tokenize=False)
    full = tok.apply_chat_template(
        [{"role": "system", "content": GUIDE}, {"role": "user", "content": LIVE}],
        tokenize=False,
        add_generation_prompt=True,
    )
    live = full[len(guide) :]
    guide_ids = guide_ids_of(tok, guide)
    live_ids = tok(live, add_special_tokens=False)["input_ids"]
    assert tok(full, add_special_tokens=False)["input_ids"] == guide_ids + live_ids
    with tempfile.TemporaryDirectory() as tmp:
        save_pack(lm.model, f"{tmp}/pack", guide_text=guide, guide_ids=guide_ids, tokenizer=tok)
        noise = continuation_check(lm, session, guide_ids + live_ids, new_tokens=1, host=host).noise
        runs = [
            pack_check(f"{tmp}/pack", session, guide_ids, live_ids, noise=noise, new_tokens=8, host=host)
            for _ in range(args.repeats)
        ]
    r = runs[-1]
    med = lambda f: statistics.median(f(x) for x in runs)  # noqa: E731
    print(
        "| guide / live tokens | tokens equal (all 8) | first-step diff / noise | llama.cpp guide prefill | "
        "pack read + export | llama.cpp load | saved |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {r.guide_tokens} / {r.live_tokens} | {r.pack_tokens == r.native_tokens} | {r.first_step_diff:.3f} / "
        f"{noise:.3f} | {1e3 * med(lambda x: x.guide_prefill_s):.1f} ms | {1e3 * med(lambda x: x.export_s):.1f} ms | "
        f"{1e3 * med(lambda x: x.load_s):.1f} ms | {1e3 * med(lambda x: x.saved_s):.1f} ms "
        f"({med(lambda x: x.guide_prefill_s) / med(lambda x: x.export_s + x.load_s):.0f}x) |"
    )

    print("\n## 4. Time per token (medians)\n")
    print(
        "| tokens | llama.cpp prefill | export (KVState -> file) | llama.cpp load | llama.cpp save | "
        "import (file -> KVState) | file MB |"
    )
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for n in lengths:
        ids = [int(t) for t in rng.integers(200, 40000, size=n)]
        with torch.no_grad():
            state = adapter.extract(lm.model, torch.tensor([ids]))
        session.prefill(ids)
        prefill = _median(lambda: session.prefill(ids), args.repeats)
        export = _median(lambda: L.export_state(state, target, v_trans=session.v_trans, host=host), args.repeats)
        data = L.export_state(state, target, v_trans=session.v_trans, host=host)
        loadt = _median(lambda: session.load_state(data), args.repeats)
        save = _median(session.state_bytes, args.repeats)
        own = session.state_bytes()
        imp = _median(lambda: L.import_state(own, target, host=host), args.repeats)
        us = lambda s: f"{1e6 * s / n:.0f} us"  # noqa: E731
        print(f"| {n} | {us(prefill)} | {us(export)} | {us(loadt)} | {us(save)} | {us(imp)} | {len(data) / 1e6:.2f} |")

    print("\n## 5. Round trip llama.cpp -> KVState -> llama.cpp\n")
    print(
        "| tokens | file byte-identical | max abs logit diff (4 greedy steps) | tokens equal | save | import | "
        "export | load |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in lengths:
        ids = [int(t) for t in rng.integers(200, 40000, size=n)]
        r = roundtrip_check(session, ids, new_tokens=4, host=host)
        ms = lambda s: f"{1e3 * s:.1f} ms"  # noqa: E731
        print(
            f"| {n} | {r.same_bytes} | {r.reload_diff:.1f} | {r.tokens_equal} | {ms(r.save_s)} | {ms(r.import_s)} | "
            f"{ms(r.export_s)} | {ms(r.load_s)} |"
        )
    session.close()
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
