"""``kvbridge graft``: a chunk's cache prepared alone, placed after other context, optionally blended."""

from __future__ import annotations

import sys

import click

from kvbridge.cli.options import dtype_option, echo_result, echo_written, json_option, settings_from, settings_options
from kvbridge.recompute.settings import GraftRunSettings, GraftSettings


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

    return torch.tensor([tok(read_text_arg(text, what), add_special_tokens=special)["input_ids"]], dtype=torch.long)


@graft.command("run")
@click.argument("model")
@settings_options(GraftRunSettings, after={"max_new_tokens": [dtype_option, json_option]})
def run_cmd(model, dtype, as_json, **options):
    """Graft a chunk after CONTEXT, continue PROMPT greedily, and compare with a full prefill."""
    from kvbridge.models import load as load_model
    from kvbridge.recompute.graft import graft_and_continue, prepare_chunk
    from kvbridge.transfer_run import check_generation_length, max_positions_of

    s = settings_from(GraftRunSettings, options)  # every check runs here, before the model loads
    loaded = load_model(model, dtype=dtype)
    m, tok = loaded.model, loaded.tokenizer
    ctx = _ids(tok, s.context, True, "context")
    if s.pack_dir:
        from kvbridge.prefix.packs import load_pack

        chunk_state = load_pack(s.pack_dir, m, tokenizer=tok).state
    else:
        chunk_state = prepare_chunk(m, _ids(tok, s.chunk, False, "chunk"))
    live = _ids(tok, s.prompt, False, "prompt")
    check_generation_length(
        ctx.shape[1] + chunk_state.num_tokens + live.shape[1],
        s.max_new_tokens,
        max_positions_of(m),
        prompt_flag="--context + --chunk + --prompt",
    )
    out = {"model": model, **graft_and_continue(m, tok, ctx, chunk_state, live, s.ratio, s.max_new_tokens)}
    text = [
        f"{model}: context {out['context_tokens']} + chunk {out['chunk_tokens']} (grafted, re-positioned) + "
        f"prompt {out['prompt_tokens']} tokens; recomputed {out['recomputed']} chunk tokens "
        f"({s.ratio:.0%}), {out['flop_share']:.3f} of a full prefill's FLOPs",
        *(
            f"  {k:8s} first-token KL to full prefill {out['first_token_kl'][k]:.5f}; greedy equal for "
            f"{out['greedy_agreement_steps'][k]}/{s.max_new_tokens} steps: {out['text'][k]!r}"
            for k in ("naive", "grafted")
        ),
        f"  full     {out['text']['full']!r}",
    ]
    echo_result(out, as_json, text, ensure_ascii=False)


@graft.command("eval")
@click.argument("model")
@settings_options(GraftSettings, after={"seed": [dtype_option], "report_dir": [json_option]})
def eval_cmd(model, dtype, as_json, **options):
    """Graft conditions on held-out corpus windows: context | chunk | continuation, contiguous text.

    full (ceiling), naive graft, blend@R, random@R and the other controls, dropped (floor); gap
    recovered with paired bootstrap intervals, KL p95, attention cosine, FLOPs and time vs a full prefill.
    """
    from kvbridge.evaluate import corpus_samples
    from kvbridge.models import load as load_model
    from kvbridge.recompute import report
    from kvbridge.recompute.graft import run_graft

    s = settings_from(GraftSettings, options)  # every check runs here, before the model loads
    loaded = load_model(model, dtype=dtype)
    m, tok = loaded.model, loaded.tokenizer
    ids, _ = corpus_samples(s.corpus, tok, n=s.samples, length=s.sample_len)  # windows of the held-out tail
    c, n = s.context_len, s.chunk_len

    def progress(done, total):
        if not as_json and sys.stderr.isatty():
            click.echo(f"\r  {done}/{total} samples", nl=done == total, err=True)

    result = run_graft(m, (ids[:, :c], ids[:, c : c + n], ids[:, c + n :]), s, progress=progress)
    result["model"] = model
    if s.report_dir:
        echo_written(report.write(result, s.report_dir, "graft", f"graft on {model}"), as_json)
    echo_result(result, as_json, lambda: report.table(result))
