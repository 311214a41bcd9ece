"""Does the guide's instruction change what SmolLM2-135M-Instruct writes? Rates over many samples.

    python bench/seed_experiments_steer.py [--samples 64 --tokens 64 --temperature 0.7 --top-p 0.9]

The guide is a system turn with the zorp rule (``seed_experiments.RULE``: begin every list item
with "zorp:"), the live prompt the user turn "List five fruits." + the assistant header (chat
template, exact-token split asserted). Every arm samples the same seeds (one
``torch.Generator`` per sample, the inverse-CDF sampler of ``kvbridge.prefix.diverge``), batched:

- ``no_guide``: the live prompt alone (no system turn);
- ``visible``: system turn + live prompt, prefilled together;
- ``hidden``: the system turn restored from a prefix pack (no forward pass), the live prompt
  prefilled after it;
- ablations of the hidden guide at a layer set (all 30, 0-9, 10-19, 20-29), on the guide
  positions: ``k_zero``, ``v_zero``, ``kv_zero`` (the tensors zeroed) and ``remove`` (the guide
  masked out of attention at those layers for the live prefill and every decode step, with
  :class:`kvbridge.prefix.ablate.GuideMask`; at all layers the live positions are re-numbered
  from 0, which makes it the no-guide sequence).

A sample *follows the rule* when a line of its answer (decoded up to ``<|im_end|>``) starts with
"zorp" (case-insensitive, after optional whitespace); *mentions zorp* when "zorp" occurs at all;
*has a list* when a line starts with a usual list marker (``-``, ``*``, ``•``, ``1.``/``1)``) or
with "zorp"; *uses forbidden markers* when a line starts with one of the markers the rule forbids
(dash, star, bullet, number): the rule's second half, which a model can obey without ever
writing "zorp". Rates with 95% Wilson intervals.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import seed_experiments as se  # noqa: E402

FOLLOW = re.compile(r"^\s*zorp\b", re.I | re.M)
LISTY = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)]|zorp\b)", re.I | re.M)
CONVENTIONAL = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])", re.M)
LAYER_SETS = {"all": None, "0-9": range(0, 10), "10-19": range(10, 20), "20-29": range(20, 30)}


def answer(tok, ids, eos: int) -> str:
    ids = list(ids)
    if eos in ids:
        ids = ids[: ids.index(eos)]
    return tok.decode(ids, skip_special_tokens=True)


def sample_arm(model, cache, live_ids, positions, seeds, steps, sampler, mask=None):
    """Prefill ``live_ids`` after ``cache`` for every seed (batched) and sample ``steps`` tokens."""
    import torch
    from transformers import DynamicCache

    batch = len(seeds)
    cache = cache if cache is not None else DynamicCache()
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    out = []
    pos = None if positions is None else torch.tensor([positions] * batch)
    with torch.no_grad():
        if mask is not None:
            mask.active = True
        kw = {} if pos is None else {"position_ids": pos}
        logits = (
            model(input_ids=torch.tensor([live_ids] * batch), cache=cache, use_cache=True, logits_to_keep=1, **kw)
            .logits[:, -1]
            .float()
        )
        first = logits.clone()
        nextpos = None if positions is None else positions[-1] + 1
        for step in range(steps):
            toks, _ = se.draw_batch(sampler, logits, gens)
            out.append(toks)
            if step + 1 < steps:
                kw = {} if nextpos is None else {"position_ids": torch.full((batch, 1), nextpos + step)}
                logits = (
                    model(input_ids=torch.tensor(toks)[:, None], cache=cache, use_cache=True, **kw)
                    .logits[:, -1]
                    .float()
                )
        if mask is not None:
            mask.active = False
    return [list(col) for col in zip(*out)], first[0]


def rates(texts):
    from kvbridge.prefix.diverge import wilson_interval

    n = len(texts)
    out = {}
    for name, fn in (
        ("follows_rule", lambda t: bool(FOLLOW.search(t))),
        ("mentions_zorp", lambda t: "zorp" in t.lower()),
        ("has_list", lambda t: bool(LISTY.search(t))),
        ("forbidden_markers", lambda t: bool(CONVENTIONAL.search(t))),
    ):
        k = sum(fn(t) for t in texts)
        lo, hi = wilson_interval(k, n)
        out[name] = {"k": k, "n": n, "rate": k / n if n else 0.0, "wilson95": [round(lo, 4), round(hi, 4)]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--arms", default="", help="comma list of arms to run (default: all)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import torch

    from kvbridge.plugins import get_host
    from kvbridge.prefix.ablate import GuideMask
    from kvbridge.prefix.diverge import Sampler

    def log(s):
        print(s, file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    model, tok = se.load(args.threads)
    guide, live = se.chat_texts(tok)
    report, split = se.exact_split(tok, guide, live)
    ghost, live_ids = list(split.ghost), list(split.live)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    adapter = get_host().adapter_for(model.config.to_dict())
    state = adapter.extract(model, torch.tensor([ghost]))
    start, stop = 0, len(ghost)  # no BOS: every ghost position is guide content
    sampler = Sampler(args.temperature, args.top_p)
    seeds = list(range(args.samples))
    L = model.config.num_hidden_layers

    def zeroed(k: bool, v: bool, layers):
        from dataclasses import replace

        keys, values = [t.clone() for t in state.keys], [t.clone() for t in state.values]
        for i in layers:
            if k:
                keys[i][:, :, start:stop] = 0
            if v:
                values[i][:, :, start:stop] = 0
        return replace(state, keys=tuple(keys), values=tuple(values))

    arms = {}

    def arm(name, fn):
        if args.arms and name not in args.arms.split(","):
            return
        t0 = time.perf_counter()
        toks, first = fn()
        texts = [answer(tok, t, eos) for t in toks]
        arms[name] = {
            "rates": rates(texts),
            "examples": texts[:3],
            "first_logits": first,
            "seconds": time.perf_counter() - t0,
        }
        r = arms[name]["rates"]
        log(
            f"{name:<18} follows {r['follows_rule']['k']}/{r['follows_rule']['n']}  mentions "
            f"{r['mentions_zorp']['k']}  list {r['has_list']['k']}  forbidden {r['forbidden_markers']['k']}  "
            f"({arms[name]['seconds']:.0f}s)"
        )

    # the pack round trip for the hidden arm: saved and restored through the real pack code
    import tempfile

    from kvbridge.family_adapter import weights_fingerprint
    from kvbridge.prefix import packs

    wfp = weights_fingerprint(model)
    with tempfile.TemporaryDirectory(prefix="kvbridge-steer-") as tmp:
        none_fp = {"fingerprint": None, "kind": "", "vocab_size": 0, "source": "none"}
        packs.save_pack(
            model, f"{tmp}/pack", guide_ids=ghost, guide_text=split.ghost_text, tokenizer_fp=none_fp, weights_fp=wfp
        )
        pack = packs.load_pack(f"{tmp}/pack", model, weights_fp=wfp)
    hidden_state = pack.state_for(model)

    from transformers import DynamicCache

    n = len(seeds)
    arm("no_guide", lambda: sample_arm(model, None, live_ids, None, seeds, args.tokens, sampler))
    arm("visible", lambda: sample_arm(model, DynamicCache(), list(report.joint), None, seeds, args.tokens, sampler))
    arm(
        "hidden", lambda: sample_arm(model, se.tile_cache(hidden_state, n), live_ids, None, seeds, args.tokens, sampler)
    )
    for lname, layers in LAYER_SETS.items():
        sel = list(range(L)) if layers is None else list(layers)
        for cname, k, v in (("k_zero", True, False), ("v_zero", False, True), ("kv_zero", True, True)):
            arm(
                f"{cname}@{lname}",
                lambda k=k, v=v, sel=sel: sample_arm(
                    model, se.tile_cache(zeroed(k, v, sel), n), live_ids, None, seeds, args.tokens, sampler
                ),
            )

        def removed(sel=sel, lname=lname):
            m = GuideMask(model, sel, start, stop)
            try:
                positions = list(range(len(live_ids))) if lname == "all" else None
                return sample_arm(model, se.tile_cache(state, n), live_ids, positions, seeds, args.tokens, sampler, m)
            finally:
                m.remove()

        arm(f"remove@{lname}", removed)

    ref = {k: arms[k]["first_logits"] for k in ("visible", "no_guide") if k in arms}
    checks = {}
    if "hidden" in arms and "visible" in ref:
        checks["hidden_vs_visible_first_step_max_abs_logit_diff"] = float(
            (arms["hidden"]["first_logits"] - ref["visible"]).abs().max()
        )
    if "remove@all" in arms and "no_guide" in ref:
        checks["remove_all_vs_no_guide_first_step_max_abs_logit_diff"] = float(
            (arms["remove@all"]["first_logits"] - ref["no_guide"]).abs().max()
        )
    for a in arms.values():
        a.pop("first_logits")
    result = {
        "experiment": "steer",
        "rule": se.RULE,
        "prompt": se.PROMPT,
        "guide": guide,
        "live": live,
        "split": {
            "ghost_len": len(ghost),
            "live_len": len(live_ids),
            "joint_len": len(report.joint),
            "ghost_plus_live_equals_joint": True,
        },
        "sampler": sampler.to_dict(),
        "samples": n,
        "tokens": args.tokens,
        "arms": arms,
        "checks": checks,
        "seconds": time.perf_counter() - t_start,
        "threads": torch.get_num_threads(),
        "command": "python bench/seed_experiments_steer.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def render(res: dict) -> str:
    lines = [
        f"{res['samples']} samples x {res['tokens']} tokens per arm, temperature {res['sampler']['temperature']}, "
        f"top-p {res['sampler']['top_p']}; split ghost {res['split']['ghost_len']} + live {res['split']['live_len']} "
        f"= joint {res['split']['joint_len']} (asserted)",
        "",
        "| arm | follows the rule [Wilson 95%] | mentions zorp [Wilson 95%] | has a list [Wilson 95%] "
        "| forbidden markers [Wilson 95%] |",
        "|---|---|---|---|---|",
    ]
    for name, a in res["arms"].items():
        cells = []
        for key in ("follows_rule", "mentions_zorp", "has_list", "forbidden_markers"):
            r = a["rates"][key]
            cells.append(f"{r['k']}/{r['n']} = {r['rate']:.2f} [{r['wilson95'][0]:.2f}, {r['wilson95'][1]:.2f}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for k, v in res["checks"].items():
        lines.append(f"\n{k}: {v:.3g}")
    lines.append(f"\n({res['seconds']:.0f} s)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
