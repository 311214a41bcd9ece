"""The seed notes' experiments rerun on SmolLM2-135M-Instruct with its chat template.

    python bench/seed_experiments.py diverge [--seeds 64 --tokens 300 --full-seeds 20 --full-tokens 64]
    python bench/seed_experiments.py packs   [--lengths 512,2048,4096 --repeats 3]
    python bench/seed_experiments_steer.py   (the behavioural "KV steering" question)

The guide is a system turn holding a formatting rule; the live prompt is the user turn plus the
assistant header, rendered exactly as the model's own chat template renders the two messages
(asserted), and split at the system turn's end with the exact-token split (``ghost + live ==
joint``, asserted id for id in every run).

``diverge``: the four execution paths of :mod:`kvbridge.prefix.diverge` (full recompute, cached
visible, split-KV from a prefix pack, FORCE_CONCAT of the split's ids), sampled with its
inverse-CDF sampler (one uniform per step from a ``torch.Generator`` per seed), batched over
seeds (every path sees the same batch layout). Comparisons are made online (no logits kept):
per pair and seed, identical or the first divergence and, at that step, argmax agreement,
top-25 overlap, max abs logit gap and the TV distance after top-p, summarised by
``kvbridge.prefix.diverge.summarise`` (Wilson intervals). The no-cache ``full`` path costs
O(T^2) forwards, so it runs on the first ``--full-seeds`` seeds for ``--full-tokens`` steps;
the other pairs use every seed and ``--tokens`` steps. Greedy decoding is one more batch row.

``packs``: a prefix pack of real size saved once, then restored (zero forward passes) vs
prefilling the same ids; the greedy continuation after the restored cache must be bitwise
equal to the one after the prefill.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from itertools import combinations
from pathlib import Path

RULE = (
    "Formatting rule: whenever you write a list, begin every list item with the word zorp "
    "followed by a colon, for example 'zorp: apples'. Never use dashes, stars or numbers as list markers."
)
PROMPT = "List five fruits."


# -- model and texts ------------------------------------------------------------------------------
def load(threads: int = 2, dtype: str = "float32"):
    import torch
    import transformers

    from kvbridge.models import load as load_model

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    loaded = load_model("smollm2", dtype=dtype)
    model, tok = loaded.model, loaded.tokenizer
    model.eval()
    return model, tok


def chat_texts(tok, rule: str = RULE, prompt: str = PROMPT) -> tuple[str, str]:
    """``(guide, live)``: the system turn and the user turn + assistant header, as the template renders them."""
    guide = f"<|im_start|>system\n{rule}<|im_end|>\n"
    live = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    rendered = tok.apply_chat_template(
        [{"role": "system", "content": rule}, {"role": "user", "content": prompt}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert rendered == guide + live, f"chat template renders {rendered!r}, expected {guide + live!r}"
    return guide, live


def exact_split(tok, guide: str, live: str):
    """The safe split, asserted ``ghost + live == joint`` id for id; returns ``(report, split)``."""
    from kvbridge.prefix.splits import exact_split as _exact

    report, split = _exact(tok, guide, live, "")
    assert list(split.ids) == list(report.joint), "exact-token split does not reproduce the joint ids"
    return report, split


def tile_cache(state, batch: int):
    """A DynamicCache holding ``state`` (batch 1) repeated ``batch`` times."""
    from transformers import DynamicCache

    return DynamicCache(
        [
            (k.expand(batch, -1, -1, -1).contiguous(), v.expand(batch, -1, -1, -1).contiguous())
            for k, v in zip(state.keys, state.values)
        ]
    )


def draw_batch(sampler, logits, gens):
    """``Sampler.draw`` for a batch: row i uses generator ``gens[i]`` (None: argmax). Returns ``(tokens, probs)``."""
    import torch

    p = sampler.probs(logits)
    toks = []
    cdf = torch.cumsum(p, dim=-1)
    for i, g in enumerate(gens):
        if g is None:
            toks.append(int(logits[i].argmax()))
            continue
        u = torch.rand((), generator=g, dtype=torch.float64)
        idx = int(torch.searchsorted(cdf[i], (u * cdf[i, -1]).reshape(1), right=True)[0])
        idx = min(idx, p.shape[-1] - 1)
        while p[i, idx] == 0 and idx > 0:
            idx -= 1
        toks.append(idx)
    return toks, p


# -- diverge, batched over seeds ------------------------------------------------------------------
class Path_:
    """One execution path for a batch of rows, stepped one token at a time."""

    def __init__(self, name, model, joint, split, pack_state, batch):
        import torch

        self.name, self.model, self.batch = name, model, batch
        self.seq = torch.tensor([list(joint)] * batch)
        self.cache = None
        with torch.no_grad():
            if name == "full":
                self.logits = self._full()
            elif name in ("cached", "concat"):
                from transformers import DynamicCache

                ids = joint if name == "cached" else list(split.ids)
                self.cache = DynamicCache()
                out = model(input_ids=torch.tensor([ids] * batch), cache=self.cache, use_cache=True, logits_to_keep=1)
                self.logits = out.logits[:, -1].float()
            elif name == "split":
                self.cache = tile_cache(pack_state, batch)
                out = model(
                    input_ids=torch.tensor([list(split.live)] * batch),
                    cache=self.cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                self.logits = out.logits[:, -1].float()
            else:
                raise ValueError(name)

    def _full(self):
        return self.model(input_ids=self.seq, use_cache=False, logits_to_keep=1).logits[:, -1].float()

    def step(self, toks):
        import torch

        t = torch.tensor(toks)[:, None]
        with torch.no_grad():
            if self.name == "full":
                self.seq = torch.cat([self.seq, t], dim=1)
                self.logits = self._full()
            else:
                self.logits = self.model(input_ids=t, cache=self.cache, use_cache=True).logits[:, -1].float()


class PairTracker:
    """Online version of ``kvbridge.prefix.diverge.compare_trajectories`` for every row of a batch."""

    def __init__(self, batch: int):
        self.first = [None] * batch
        self.max_abs = [0.0] * batch
        self.bitwise = [True] * batch
        self.at = [None] * batch

    def update(self, step, la, lb, ta, tb, sampler):
        import torch

        from kvbridge.prefix.diverge import TOP_K

        live = [i for i in range(len(ta)) if self.first[i] is None]
        if not live:
            return
        diff = (la[live] - lb[live]).abs().amax(dim=-1)
        eq = (la[live] == lb[live]).all(dim=-1)
        for j, i in enumerate(live):
            self.max_abs[i] = max(self.max_abs[i], float(diff[j]))
            self.bitwise[i] = self.bitwise[i] and bool(eq[j])
            if ta[i] != tb[i]:
                self.first[i] = step
                a, b = la[i], lb[i]
                sa = set(torch.topk(a, TOP_K).indices.tolist())
                sb = set(torch.topk(b, TOP_K).indices.tolist())
                pa, pb = sampler.probs(a), sampler.probs(b)
                self.at[i] = {
                    "step": step,
                    "token_a": ta[i],
                    "token_b": tb[i],
                    "argmax_agree": int(a.argmax()) == int(b.argmax()),
                    "top25_overlap": len(sa & sb),
                    "max_abs_logit_diff": float((a - b).abs().max()),
                    "tv_post_top_p": float(0.5 * (pa - pb).abs().sum()),
                }

    def results(self, rows):
        out = []
        for i in rows:
            r = {
                "identical": self.first[i] is None,
                "first_divergence": self.first[i],
                "max_abs_logit_diff_shared_steps": self.max_abs[i],
                "bitwise_equal_logits": self.bitwise[i],
            }
            if self.at[i] is not None:
                r["at_divergence"] = self.at[i]
            out.append(r)
        return out


def run_paths(model, joint, split, pack_state, paths, seeds, steps, sampler, log):
    """Lock-step run of ``paths`` for ``seeds`` (+ one greedy row); per pair: sampled results, greedy result."""
    import torch

    batch = len(seeds) + 1
    runs = {p: Path_(p, model, joint, split, pack_state, batch) for p in paths}
    gens = {p: [torch.Generator().manual_seed(int(s)) for s in seeds] + [None] for p in paths}
    pairs = list(combinations(paths, 2))
    trackers = {pr: PairTracker(batch) for pr in pairs}
    tokens = {p: [] for p in paths}
    t0 = time.perf_counter()
    for step in range(steps):
        toks = {}
        for p in paths:
            toks[p], _ = draw_batch(sampler, runs[p].logits, gens[p])
            tokens[p].append(toks[p])
        for a, b in pairs:
            trackers[(a, b)].update(step, runs[a].logits, runs[b].logits, toks[a], toks[b], sampler)
        if step + 1 < steps:
            for p in paths:
                runs[p].step(toks[p])
        if step % 25 == 0:
            log(f"  step {step}/{steps} ({time.perf_counter() - t0:.0f}s)")
    out = {}
    for (a, b), tr in trackers.items():
        res = tr.results(range(batch))
        for r, s in zip(res, list(seeds) + ["greedy"]):
            r["seed"] = s
        out[f"{a}-vs-{b}"] = {"sampled": res[:-1], "greedy": res[-1]}
    return out, {p: [list(col) for col in zip(*tokens[p])] for p in paths}, time.perf_counter() - t0


def diverge_experiment(args, log) -> dict:
    import torch

    from kvbridge.family_adapter import weights_fingerprint
    from kvbridge.prefix import packs
    from kvbridge.prefix.diverge import Sampler, summarise

    model, tok = load(args.threads, args.dtype)
    guide, live = chat_texts(tok)
    report, split = exact_split(tok, guide, live)
    sampler = Sampler(args.temperature, args.top_p)
    wfp = weights_fingerprint(model)
    with tempfile.TemporaryDirectory(prefix="kvbridge-seedexp-") as tmp:
        none_fp = {"fingerprint": None, "kind": "", "vocab_size": 0, "source": "none"}
        packs.save_pack(
            model,
            f"{tmp}/pack",
            guide_ids=list(split.ghost),
            guide_text=split.ghost_text,
            tokenizer_fp=none_fp,
            weights_fp=wfp,
        )
        pack = packs.load_pack(f"{tmp}/pack", model, weights_fp=wfp)
    state = pack.state_for(model)
    results: dict = {}
    log(f"phase A: full + cached + split + concat, {args.full_seeds} seeds x {args.full_tokens} tokens")
    a_res, a_tok, a_s = run_paths(
        model,
        report.joint,
        split,
        state,
        ("full", "cached", "split", "concat"),
        list(range(args.full_seeds)),
        args.full_tokens,
        sampler,
        log,
    )
    log(f"phase B: cached + split + concat, {args.seeds} seeds x {args.tokens} tokens")
    b_res, b_tok, b_s = run_paths(
        model,
        report.joint,
        split,
        state,
        ("cached", "split", "concat"),
        list(range(args.seeds)),
        args.tokens,
        sampler,
        log,
    )
    for name, r in a_res.items():
        if name.startswith("full"):
            results[name] = {
                "seeds": args.full_seeds,
                "tokens": args.full_tokens,
                "summary": summarise(r["sampled"]),
                "greedy": r["greedy"],
            }
    for name, r in b_res.items():
        results[name] = {
            "seeds": args.seeds,
            "tokens": args.tokens,
            "summary": summarise(r["sampled"]),
            "greedy": r["greedy"],
        }
    sample = tok.decode(b_tok["cached"][0][: args.tokens], skip_special_tokens=False)
    greedy_text = tok.decode(b_tok["cached"][-1], skip_special_tokens=False)
    return {
        "experiment": "diverge",
        "model": "smollm2 (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized float32)",
        "guide": guide,
        "live": live,
        "split": {
            "joint_len": len(report.joint),
            "ghost_len": len(split.ghost),
            "live_len": len(split.live),
            "ghost_plus_live_equals_joint": True,
            "naive_matches_joint": report.naive.matches_joint,
        },
        "sampler": sampler.to_dict(),
        "pairs": results,
        "seconds": {"phase_a": a_s, "phase_b": b_s},
        "example_seed0_cached": sample,
        "example_greedy_cached": greedy_text,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "dtype": args.dtype,
    }


def render_diverge(res: dict) -> str:
    s = res["split"]
    lines = [
        f"split: ghost {s['ghost_len']} + live {s['live_len']} = joint {s['joint_len']} ids (asserted equal); "
        f"naive split matches joint: {s['naive_matches_joint']}",
        f"sampler: temperature {res['sampler']['temperature']}, top-p {res['sampler']['top_p']}",
        "",
        "| pair | seeds x tokens | identical [Wilson 95%] | diverged | first step (median, min) | argmax agree "
        "| top-25 overlap (min, median) | max abs logit gap (median, max) | TV after top-p (median, max) "
        "| max abs logit diff, shared steps | bitwise-equal seeds | greedy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in res["pairs"].items():
        sm = r["summary"]
        lo, hi = sm["identical_rate_wilson95"]
        d = sm.get("at_divergence")
        g = r["greedy"]
        gtxt = "identical" if g["identical"] else f"diverged at {g['first_divergence']}"
        if d:
            div = (
                f"{d['first_step_median']}, {d['first_step_min']} | {d['argmax_agree']}/{sm['diverged']} | "
                f"{d['top25_overlap_min']}, {d['top25_overlap_median']} | {d['max_abs_logit_diff_median']:.3g}, "
                f"{d['max_abs_logit_diff_max']:.3g} | {d['tv_post_top_p_median']:.3g}, {d['tv_post_top_p_max']:.3g}"
            )
        else:
            div = "- | - | - | - | -"
        lines.append(
            f"| {name} | {r['seeds']} x {r['tokens']} | {sm['identical']}/{sm['n']} [{lo:.2f}, {hi:.2f}] | "
            f"{sm['diverged']} | {div} | {sm['max_abs_logit_diff_shared_steps_max']:.3g} | "
            f"{sm['bitwise_equal_logits']}/{sm['n']} | {gtxt} |"
        )
    return "\n".join(lines)


# -- packs at real size -----------------------------------------------------------------------------
def packs_experiment(args, log) -> dict:
    import torch
    from transformers import DynamicCache

    from kvbridge.family_adapter import weights_fingerprint
    from kvbridge.prefix.packs import load_pack, save_pack

    model, tok = load(args.threads)
    text = Path(args.corpus).read_text(encoding="utf-8")
    ids_all = tok(text[:200_000], add_special_tokens=False)["input_ids"]
    wfp = weights_fingerprint(model)
    calls = [0]
    model.register_forward_pre_hook(lambda m, a, k: calls.__setitem__(0, calls[0] + 1), with_kwargs=True)
    rows = []
    nxt = tok(" And", add_special_tokens=False)["input_ids"]

    def timed(fn, repeats):
        out = fn()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn()
            ts.append((time.perf_counter() - t0) * 1000)
        return statistics.median(ts), out

    def greedy(cache, n=16):
        toks, logits = [], []
        t = torch.tensor([nxt])
        with torch.no_grad():
            for _ in range(n):
                lg = model(input_ids=t, cache=cache, use_cache=True).logits[0, -1]
                logits.append(lg.clone())
                t = torch.tensor([[int(lg.argmax())]])
                toks.append(int(t))
        return toks, torch.stack(logits)

    with tempfile.TemporaryDirectory(prefix="kvbridge-seedpack-") as tmp:
        for n in [int(x) for x in args.lengths.split(",")]:
            ids = torch.tensor([ids_all[:n]])

            def prefill():
                cache = DynamicCache()
                with torch.no_grad():
                    model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
                return cache

            log(f"  {n} tokens")
            pre_ms, cache = timed(prefill, args.repeats)
            out = Path(tmp) / f"pack-{n}"
            t0 = time.perf_counter()
            save_pack(model, out, guide_ids=ids[0].tolist(), weights_fp=wfp)
            save_ms = (time.perf_counter() - t0) * 1000
            before = calls[0]
            load_ms, restored = timed(lambda: load_pack(out, model, weights_fp=wfp).cache(model), args.repeats)
            forwards = calls[0] - before
            ta, la = greedy(cache)
            tb, lb = greedy(restored)
            rows.append(
                {
                    "tokens": n,
                    "prefill_ms": pre_ms,
                    "load_ms": load_ms,
                    "ratio": pre_ms / load_ms,
                    "mb": (out / "kv.safetensors").stat().st_size / 1e6,
                    "save_ms": save_ms,
                    "forwards_on_load": forwards,
                    "greedy_tokens_equal": ta == tb,
                    "logits_bitwise_equal": bool(torch.equal(la, lb)),
                    "max_abs_logit_diff": float((la - lb).abs().max()),
                }
            )
    return {
        "experiment": "packs",
        "rows": rows,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "weights_fingerprint_once": True,
    }


def render_packs(res: dict) -> str:
    lines = [
        "| guide tokens | prefill (ms) | pack load (ms) | prefill / load | kv.safetensors (MB) | save, once (ms) "
        "| forwards on load | 16 greedy tokens equal | logits bitwise equal |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['tokens']:,} | {r['prefill_ms']:.0f} | {r['load_ms']:.0f} | {r['ratio']:.1f}x | "
            f"{r['mb']:.1f} | {r['save_ms']:.0f} | {r['forwards_on_load']} | {r['greedy_tokens_equal']} | "
            f"{r['logits_bitwise_equal']} (max {r['max_abs_logit_diff']:.1e}) |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", choices=["diverge", "packs"])
    ap.add_argument("--seeds", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--full-seeds", type=int, default=20)
    ap.add_argument("--full-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--lengths", default="512,2048,4096")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--corpus", default="/work/shared/corpora/tinyshakespeare.txt")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16 (the weights are cast after dequantizing)")
    ap.add_argument("--json", type=Path, help="write the full result here")
    args = ap.parse_args(argv)

    def log(s):
        print(s, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    if args.experiment == "diverge":
        res = diverge_experiment(args, log)
        print(render_diverge(res))
    else:
        res = packs_experiment(args, log)
        print(render_packs(res))
    res["total_seconds"] = time.perf_counter() - t0
    res["command"] = "python bench/seed_experiments.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"\n({res['total_seconds']:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
