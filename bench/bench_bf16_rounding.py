"""What one rounding (float32 content, rounded once) changes for a fitted bfloat16 transfer.

    python bench/bench_bf16_rounding.py            # zoo base -> tuned, ridge, 16 held-out prompts

A ridge mapping is fitted on the zoo pair (base -> tuned, float32, calibration text sampled from the
base model with fixed seeds). Both models are then cast to bfloat16 (parameters only, as
``from_pretrained(dtype=bfloat16)`` leaves buffers) and a bfloat16 source cache of each held-out prompt
is transferred two ways:

- ``one rounding`` (kvbridge now): strip, map and re-apply in float32, rounded once to bfloat16;
- ``rounded each step`` (kvbridge before): the stripped keys rounded to bfloat16, the mapped K/V
  rounded to bfloat16, the re-application in bfloat16 arithmetic.

Both are compared with the unrounded float32 result of the same computation (the target's tables
rounded to bfloat16, as the model holds them): the error of each key in units of a bfloat16 ulp at
its rotated pair's magnitude (0.5 is the best a bfloat16 cache can do), the share of elements that
are not the correctly rounded value, and the target's next-token logits after each cache (max
|dlogit| between the two paths, and how often their argmax differs).
"""

from __future__ import annotations

import argparse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=48)
    args = ap.parse_args(argv)

    import copy

    import torch
    import transformers

    from kvbridge.fit import fit
    from kvbridge.plugins import get_host
    from kvbridge.transfer import transfer
    from kvbridge.zoo.load import load_zoo_model

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    source, tok = load_zoo_model("base")
    target, _ = load_zoo_model("tuned")
    start = tok("\n", return_tensors="pt").input_ids.repeat(32, 1)
    texts = tok.batch_decode(source.generate(start, do_sample=True, top_k=40, max_new_tokens=64))
    mapping = fit(source, target, texts, tokenizer=tok, seq_len=64, top_k=2, stride=2)

    def bf16(model):
        m = copy.deepcopy(model)
        for p in m.parameters():
            p.data = p.data.to(torch.bfloat16)
        return m

    src, tgt = bf16(source), bf16(target)
    host = get_host()
    sad, tad = host.adapter_for(src.config.to_dict()), host.adapter_for(tgt.config.to_dict())
    tspec = tad.spec_of(tgt)
    start = tok("\n", return_tensors="pt").input_ids.repeat(args.prompts, 1)
    with torch.no_grad():
        held = source.generate(start, do_sample=True, top_k=40, max_new_tokens=args.prompt_len, generator=None)
    from kvbridge import rope

    totals = {name: dict(off=0, n=0, ulp_max=0.0, ulp_sum=0.0, v_off=0) for name in ("one", "each")}
    dlogit, flips = 0.0, 0
    bf = torch.bfloat16
    half_eps = torch.finfo(bf).eps
    for row in held:
        ids = row[None, : args.prompt_len]
        state = sad.extract(src, ids[:, :-1])
        mapped = mapping.map_content(state.strip_rope(dtype=torch.float32), tspec)  # float32 content
        exact_k = []
        for i, k in enumerate(mapped.keys):  # the unrounded float32 rotation by the bf16-rounded tables
            table = tspec.rope_for_layer(i)
            tab = rope._tables_for(table, state.positions, None, k.device, host)
            exact_k.append(
                tab.kernel(bf, inverse=False, work=torch.float32).run(
                    k, table.rotary_dim, table.interleaved, exact=False, out_dtype=torch.float32
                )
            )
        one = transfer(state, mapping, tspec)
        each = mapping.map_content(state.strip_rope(), tspec).to(dtype=bf).apply_rope(state.positions, spec=tspec)
        for name, st in (("one", one), ("each", each)):
            t = totals[name]
            for a_, x in zip(st.keys, exact_k):
                h = x.shape[-1] // 2
                mag = torch.hypot(x[..., :h], x[..., h:]).repeat(1, 1, 1, 2)
                ulp = half_eps * torch.exp2(torch.floor(torch.log2(mag.clamp_min(1e-30))))
                err = (a_.float() - x).abs() / ulp
                t["ulp_max"] = max(t["ulp_max"], float(err.max()))
                t["ulp_sum"] += float(err.sum())
                t["off"] += int((a_ != x.to(bf)).sum())
                t["n"] += a_.numel()
            t["v_off"] += sum(int((a_ != x.to(bf)).sum()) for a_, x in zip(st.values, mapped.values))
        with torch.no_grad():

            def logits(st):
                return tgt(input_ids=ids[:, -1:], cache=tad.inject(st, tgt), use_cache=True).logits[0, -1].float()

            la, lb = logits(one), logits(each)
        dlogit = max(dlogit, float((la - lb).abs().max()))
        flips += int(la.argmax() != lb.argmax())
    print(f"# zoo base -> tuned, ridge, bfloat16 caches, {args.prompts} prompts of {args.prompt_len - 1} cached tokens")
    print(
        "| path | keys not correctly rounded | values not correctly rounded | key error max (ulp) | "
        "key error mean (ulp) |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, label in (("one", "one rounding (now)"), ("each", "rounded each step (before)")):
        t = totals[name]
        print(
            f"| {label} | {100 * t['off'] / t['n']:.2f}% | {100 * t['v_off'] / t['n']:.2f}% | {t['ulp_max']:.2f} | "
            f"{t['ulp_sum'] / t['n']:.3f} |"
        )
    print(
        f"\nnext-token logits of the target, now vs before: max |dlogit| {dlogit:.3g}; argmax differs in "
        f"{flips}/{args.prompts} prompts"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
