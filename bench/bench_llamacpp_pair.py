"""The cross-model path on a real engine: Qwen2.5-Coder 0.5B (transformers) -> 1.5B (llama.cpp).

    python bench/bench_llamacpp_pair.py --run /work/pair-runs/run1 [--mapping map-k4-a0.01] [--samples 16]

``--run`` is a folder written by ``bench/bench_pair.py`` (its ``results.json`` names the corpus and
the mappings; the samples are drawn exactly as that run's eval drew them: the held-out files of the
stdlib corpus, ``--samples`` windows of prefix + continuation + 1 tokens). Per sample, scored on
the continuation's ``--continuation-len`` real next tokens (teacher forcing, one decode per token):

- **native**: llama.cpp runs the 1.5B GGUF on the prefix (its own prefill), then the continuation;
- **transferred**: transformers' 0.5B (dequantized, float32) extracts the prefix's cache, the
  fitted mapping moves it to the 1.5B's geometry (RoPE stripped and re-applied), kvbridge writes it
  in llama.cpp's sequence-state format, llama.cpp loads it on the 1.5B GGUF (no 1.5B prefill) and
  decodes the continuation;
- **source alone**: llama.cpp runs the 0.5B GGUF on the prefix and continuation (what a user gets
  by not transferring at all);
- **no prefix**: the 1.5B decodes the continuation from an empty cache.

Gap recovered = (NLL_no_prefix - NLL_x) / (NLL_no_prefix - NLL_native), with a 95% paired bootstrap
interval over samples (1,000 resamples); top-1 = share of positions whose argmax equals native's;
KL(native || x) per position. The 1.5B is never loaded in transformers (the mapping carries the
target's spec), so the run needs about 4 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def score(session, cont: list[int], targets: list[int]) -> np.ndarray:
    """Log-probabilities (positions x vocab) after each continuation token, decoded after the cache."""
    rows = []
    for tok in cont:
        rows.append(log_softmax(session.eval([tok])))
    out = np.stack(rows)
    assert out.shape[0] == len(targets)
    return out


def summarize(per: dict, targets: np.ndarray, rng: np.random.Generator, n_boot: int) -> dict:
    nll = {c: -np.take_along_axis(lp, targets[..., None], -1)[..., 0].mean(-1) for c, lp in per.items()}
    native = per["native"]
    out = {}
    boot = rng.integers(0, len(targets), size=(n_boot, len(targets)))
    for c, lp in per.items():
        gap = (nll["no_prefix"].mean() - nll[c].mean()) / (nll["no_prefix"].mean() - nll["native"].mean())
        g = [
            (nll["no_prefix"][b].mean() - nll[c][b].mean()) / (nll["no_prefix"][b].mean() - nll["native"][b].mean())
            for b in boot
        ]
        top1 = (lp.argmax(-1) == native.argmax(-1)).mean()
        kl = (np.exp(native) * (native - lp)).sum(-1)
        out[c] = {
            "nll": float(nll[c].mean()),
            "gap_recovered": float(gap),
            "gap_ci": [float(np.quantile(g, 0.025)), float(np.quantile(g, 0.975))],
            "top1_agreement": float(top1),
            "kl_mean": float(kl.mean()),
            "kl_p95": float(np.quantile(kl, 0.95)),
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a bench/bench_pair.py output folder")
    ap.add_argument("--mapping", default="map-k4-a0.01", help="mapping folder name inside --run")
    ap.add_argument(
        "--models", type=Path, default=Path(os.environ.get("KVBRIDGE_HOME", Path.home() / ".cache/kvbridge")) / "models"
    )
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=64)
    ap.add_argument("--continuation-len", type=int, default=8)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from kvbridge.evaluate.corpus import eval_corpus
    from kvbridge.engines.llamacpp import engine_model, export_state
    from kvbridge.engines.llamacpp_runtime import LlamaCppSession, binding_version
    from kvbridge.evaluate import corpus_samples
    from kvbridge.fit.artifact import load_mapping
    from kvbridge.models import load
    from kvbridge.plugins import get_host
    from kvbridge.transfer import transfer

    t_start = time.perf_counter()
    src_file = args.models / "qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    tgt_file = args.models / "qwen2.5-coder-1.5b-instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    main_run = json.loads((args.run / "results.json").read_text())
    host = get_host()
    t0 = time.perf_counter()
    src = load(str(src_file), dtype="float32", host=host)
    smodel, tok = src.model.eval(), src.tokenizer
    log(f"loaded the 0.5B in transformers in {time.perf_counter() - t0:.1f} s")
    mapping = load_mapping(args.run / args.mapping, source=smodel, host=host)  # target identity: not loaded here
    target = engine_model(str(tgt_file), host=host)
    ev = eval_corpus(
        Path(main_run["corpus"]["path"]), mapping.manifest, 0.1, explicit=False, allow=False, tokenizer=tok
    )
    length = args.prefix_len + args.continuation_len + 1
    ids, data = corpus_samples([ev.tail], tok, n=args.samples, length=length, fraction=1.0)
    assert data["heldout_tokens"] == main_run["eval_data"]["heldout_tokens"], "not the main run's held-out text"
    P, C = args.prefix_len, args.continuation_len
    sad = host.adapter_for(smodel.config.to_dict())
    n_ctx = max(256, length + 8)
    per: dict[str, list] = {c: [] for c in ("native", "transferred", "source_alone", "no_prefix")}
    timing: dict[str, list] = {
        "source_prefill_s": [],
        "map_s": [],
        "export_s": [],
        "load_s": [],
        "target_prefill_s": [],
    }
    with (
        LlamaCppSession(tgt_file, n_ctx=n_ctx, n_threads=args.threads) as big,
        LlamaCppSession(src_file, n_ctx=n_ctx, n_threads=args.threads) as small,
    ):
        for i in range(ids.shape[0]):
            row = [int(t) for t in ids[i].tolist()]
            prefix, cont, targets = row[:P], row[P : P + C], row[P + 1 : P + C + 1]
            t0 = time.perf_counter()
            big.prefill(prefix)
            timing["target_prefill_s"].append(time.perf_counter() - t0)
            per["native"].append(score(big, cont, targets))
            small.prefill(prefix)
            per["source_alone"].append(score(small, cont, targets))
            big.reset()
            per["no_prefix"].append(score(big, cont, targets))
            with torch.no_grad():
                t0 = time.perf_counter()
                state = sad.extract(smodel, torch.tensor([prefix]))
                t1 = time.perf_counter()
                moved = transfer(state, mapping, host=host)
                t2 = time.perf_counter()
            data_bytes = export_state(moved, target, v_trans=big.v_trans, host=host)
            t3 = time.perf_counter()
            big.reset()
            big.load_state(data_bytes)
            t4 = time.perf_counter()
            per["transferred"].append(score(big, cont, targets))
            for k, v in zip(("source_prefill_s", "map_s", "export_s", "load_s"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                timing[k].append(v)
            log(f"sample {i + 1}/{ids.shape[0]}")
    targets = ids[:, P + 1 : P + C + 1].numpy()
    res = summarize({c: np.stack(v) for c, v in per.items()}, targets, np.random.default_rng(0), args.bootstrap)
    out = {
        "argv": sys.argv[1:],
        "llama_cpp_python": binding_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": args.threads,
        "mapping": str(args.run / args.mapping),
        "samples": int(ids.shape[0]),
        "prefix_len": P,
        "continuation_len": C,
        "conditions": res,
        "timing_median_ms": {k: round(1e3 * float(np.median(v)), 1) for k, v in timing.items()},
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    print(report(out))
    return 0


def report(r: dict) -> str:
    names = {
        "native": "1.5B native (llama.cpp prefill)",
        "source_alone": "**0.5B alone** (llama.cpp)",
        "transferred": "transferred 0.5B -> 1.5B (loaded into llama.cpp)",
        "no_prefix": "no prefix",
    }
    lines = [
        f"{r['samples']} samples, prefix {r['prefix_len']}, continuation {r['continuation_len']}, "
        f"mapping {Path(r['mapping']).name}, llama-cpp-python {r['llama_cpp_python']}, {r['threads']} thread(s)",
        "",
        "| condition | NLL | gap recovered [95% CI] | top-1 vs native | KL mean | KL p95 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in ("native", "source_alone", "transferred", "no_prefix"):
        x = r["conditions"][c]
        lines.append(
            f"| {names[c]} | {x['nll']:.3f} | {x['gap_recovered']:.3f} [{x['gap_ci'][0]:.3f}, "
            f"{x['gap_ci'][1]:.3f}] | {x['top1_agreement']:.3f} | {x['kl_mean']:.3f} | {x['kl_p95']:.3f} |"
        )
    t = r["timing_median_ms"]
    lines += [
        "",
        f"medians per sample: 1.5B llama.cpp prefill {t['target_prefill_s']} ms; 0.5B transformers "
        f"prefill {t['source_prefill_s']} ms, mapping {t['map_s']} ms, export {t['export_s']} ms, "
        f"llama.cpp load {t['load_s']} ms; wall {r['wall_s']} s",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
