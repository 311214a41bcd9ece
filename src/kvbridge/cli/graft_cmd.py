"""``kvbridge graft``: a chunk's cache prepared alone, placed after other context, optionally blended."""

from __future__ import annotations

import json
import sys

import click

from kvbridge.cli.numbers import SEED, count
from kvbridge.cli.options import dtype_option, json_option


@click.group("graft")
def graft() -> None:
    """Graft a chunk's cache (prepared alone, or a pack) after other context; token-selective recompute.

    The chunk's keys are moved right after the context by the exact RoPE re-positioning; with
    --recompute-tokens R the CacheBlend rule recomputes the R of the chunk's tokens whose K/V
    deviate most at layer 1 (layers 0-1 run on every chunk token). MODEL: a model folder, a
    .gguf file or folder, smollm2, or zoo:NAME.
    """


def _ids(tok, text, special, what: str = "text"):
    import torch

    from kvbridge.prefix.splits import read_text_arg

    ids = tok(read_text_arg(text, what), add_special_tokens=special)["input_ids"]
    return torch.tensor([ids], dtype=torch.long)


@graft.command("run")
@click.argument("model")
@click.option("--context", required=True, help="Context text (or @FILE), prefilled at positions 0..c-1 (with BOS).")
@click.option("--chunk", default=None, help="Chunk text (or @FILE), prefilled alone at 0..n-1 (no BOS).")
@click.option(
    "--pack",
    "pack_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="A prefix pack (kvbridge pack save) to graft instead of --chunk.",
)
@click.option("--prompt", required=True, help="Text (or @FILE) that follows the chunk; the model continues it.")
@click.option("--recompute-tokens", "ratio", default="0%", show_default=True, help="Share of chunk tokens recomputed.")
@click.option("--max-new-tokens", default=24, show_default=True, type=count(1))
@dtype_option
@json_option
def run_cmd(model, context, chunk, pack_dir, prompt, ratio, max_new_tokens, dtype, as_json):
    """Graft a chunk after CONTEXT, continue PROMPT greedily, and compare with a full prefill."""
    import torch

    from kvbridge.errors import KVBridgeError
    from kvbridge.models import load as load_model
    from kvbridge.recompute.graft import _adapter, graft as do_graft, prepare_chunk
    from kvbridge.recompute.tokens import blend, parse_ratio

    if (chunk is None) == (pack_dir is None):
        raise KVBridgeError("give exactly one of --chunk and --pack", "pass --chunk TEXT or --pack DIR")
    r = parse_ratio(ratio)
    loaded = load_model(model, dtype=dtype)
    m, tok, name = loaded.model, loaded.tokenizer, model
    ad = _adapter(m)
    ctx = _ids(tok, context, True, "context")
    if pack_dir:
        from kvbridge.prefix.packs import load_pack

        chunk_state = load_pack(pack_dir, m, tokenizer=tok).state
    else:
        chunk_state = prepare_chunk(m, _ids(tok, chunk, False, "chunk"))
    live = _ids(tok, prompt, False, "prompt")
    from kvbridge.transfer_run import check_generation_length, max_positions_of

    check_generation_length(
        ctx.shape[1] + chunk_state.num_tokens + live.shape[1],
        max_new_tokens,
        max_positions_of(m),
        prompt_flag="--context + --chunk + --prompt",
    )
    ctx_state = ad.extract(m, ctx)
    grafted = do_graft(ctx_state, chunk_state)
    res = blend(m, grafted, ctx_state.num_tokens, r)
    full_ids = torch.cat([ctx, chunk_state.token_ids, live], 1)

    def greedy(state):
        cache = ad.inject(state, m, check=False) if state is not None else None
        inp, toks, first = (live if state is not None else full_ids), [], None
        with torch.no_grad():
            for _ in range(max_new_tokens):
                kw = {"cache": cache, "use_cache": True} if cache is not None else {}
                out = m(input_ids=inp, **kw)
                cache = out.past_key_values if cache is None else cache
                logits = out.logits[:, -1].double()
                first = torch.log_softmax(logits, -1) if first is None else first
                inp = logits.argmax(-1, keepdim=True)
                toks.append(int(inp))
        return toks, first

    full_toks, full_lp = greedy(None)
    got_toks, got_lp = greedy(res.state)
    naive_toks, naive_lp = greedy(grafted)
    kl = lambda lp: float((full_lp.exp() * (full_lp - lp)).sum())
    agree = lambda t: next((i for i, (a, b) in enumerate(zip(t, full_toks)) if a != b), len(full_toks))
    out = {
        "model": name,
        "context_tokens": ctx_state.num_tokens,
        "chunk_tokens": chunk_state.num_tokens,
        "prompt_tokens": int(live.shape[1]),
        "recompute_tokens": r,
        "recomputed": int(res.selected.shape[1]),
        "flop_share": res.cost.flop_share,
        "recompute_ms": 1e3 * res.cost.seconds,
        "first_token_kl": {"naive": kl(naive_lp), "grafted": kl(got_lp)},
        "greedy_agreement_steps": {"naive": agree(naive_toks), "grafted": agree(got_toks), "of": max_new_tokens},
        "text": {"full": tok.decode(full_toks), "naive": tok.decode(naive_toks), "grafted": tok.decode(got_toks)},
    }
    if as_json:
        click.echo(json.dumps(out, indent=2, ensure_ascii=False))
        return
    click.echo(
        f"{name}: context {out['context_tokens']} + chunk {out['chunk_tokens']} (grafted, re-positioned) + "
        f"prompt {out['prompt_tokens']} tokens; recomputed {out['recomputed']} chunk tokens "
        f"({r:.0%}), {out['flop_share']:.3f} of a full prefill's FLOPs"
    )
    for k in ("naive", "grafted"):
        click.echo(
            f"  {k:8s} first-token KL to full prefill {out['first_token_kl'][k]:.5f}; greedy equal for "
            f"{out['greedy_agreement_steps'][k]}/{max_new_tokens} steps: {out['text'][k]!r}"
        )
    click.echo(f"  full     {out['text']['full']!r}")


@graft.command("eval")
@click.argument("model")
@click.option("--corpus", required=True, type=click.Path(exists=True), help="Text corpus; samples from its last 10%.")
@click.option("--samples", default=32, show_default=True, type=count(2))
@click.option("--context-len", default=64, show_default=True, type=count(1))
@click.option("--chunk-len", default=64, show_default=True, type=count(1))
@click.option("--continuation-len", default=16, show_default=True, type=count(1))
@click.option("--ratios", default="5%,15%,30%,100%", show_default=True, help="Shares of chunk tokens recomputed.")
@click.option("--controls", default="random,no_reposition,shuffled", show_default=True)
@click.option("--check-layer", default=1, show_default=True, type=count(0))
@click.option("--batch-size", default=8, show_default=True, type=count(1))
@click.option("--bootstrap", default=1000, show_default=True, type=count(0))
@click.option("--seed", type=SEED, default=0, show_default=True)
@dtype_option
@click.option(
    "--report",
    "report_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Write graft.md, graft.json and graft.png here.",
)
@json_option
def eval_cmd(
    model,
    corpus,
    samples,
    context_len,
    chunk_len,
    continuation_len,
    ratios,
    controls,
    check_layer,
    batch_size,
    bootstrap,
    seed,
    dtype,
    report_dir,
    as_json,
):
    """Graft conditions on held-out corpus windows: context | chunk | continuation, contiguous text.

    full (ceiling), naive graft, blend@R, random@R and the other controls, dropped (floor); gap
    recovered with paired bootstrap intervals, KL p95, attention cosine, FLOPs and time vs a full prefill.
    """
    import torch

    from kvbridge.evaluate import heldout_text, windows
    from kvbridge.fit.calibrate import load_corpus
    from kvbridge.recompute import report
    from kvbridge.models import load as load_model
    from kvbridge.recompute.eval_run import split_list
    from kvbridge.recompute.graft import run_graft
    from kvbridge.recompute.tokens import parse_ratio

    rs = [parse_ratio(x) for x in split_list(ratios)]
    ctrl = tuple(split_list(controls))
    bad = [c for c in ctrl if c not in ("random", "first", "no_reposition", "shuffled")]
    if bad:
        from kvbridge.errors import KVBridgeError

        raise KVBridgeError(f"unknown control {bad[0]!r}", "use some of random, first, no_reposition, shuffled")
    loaded = load_model(model, dtype=dtype)
    m, tok, name = loaded.model, loaded.tokenizer, model
    texts, _ = load_corpus(corpus)
    stream = torch.tensor(tok(heldout_text(texts), add_special_tokens=False)["input_ids"], dtype=torch.long)
    L = context_len + chunk_len + continuation_len + 1
    ids = windows(stream, samples, L)

    def progress(done, total):
        if not as_json and sys.stderr.isatty():
            click.echo(f"\r  {done}/{total} samples", nl=done == total, err=True)

    result = run_graft(
        m,
        ids[:, :context_len],
        ids[:, context_len : context_len + chunk_len],
        ids[:, context_len + chunk_len :],
        ratios=rs,
        controls=ctrl,
        check_layer=check_layer,
        batch_size=batch_size,
        bootstrap=bootstrap,
        seed=seed,
        progress=progress,
    )
    result["model"] = name
    if report_dir:
        written = report.write(result, report_dir, "graft", f"graft on {name}")
        if not as_json:
            click.echo(f"report: {', '.join(str(p) for p in written.values())}", err=True)
    click.echo(json.dumps(result, indent=2) if as_json else report.table(result))
