"""``kvbridge diverge``: full recompute vs cached vs split vs concat, same seeds, same sampler."""

from __future__ import annotations

import click

from kvbridge.cli.options import echo_result, json_option, loading_options, settings_from, settings_options
from kvbridge.prefix.diverge import DivergeSettings


@click.command("diverge")
@click.argument("model")
@click.option("--guide", required=True, help="Guide text (restored from a pack on the split path), or @FILE.")
@click.option("--prompt", required=True, help="Live prompt, or @FILE.")
@settings_options(
    DivergeSettings,
    after={
        "split": [
            click.option(
                "--pack", "pack_dir", default=None, type=click.Path(), help="Use this saved pack for the split path."
            )
        ],
        "paths": [
            loading_options,
            json_option,
            click.option(
                "--partial",
                "partial_path",
                type=click.Path(dir_okay=False),
                help="JSONL of finished seeds, rewritten atomically after each (kept when the run is killed).",
            ),
        ],
    },
)
def diverge(model, guide, prompt, pack_dir, tokenizer, dtype, device, as_json, partial_path, **options) -> None:
    """Compare execution paths of GUIDE + SEP + PROMPT on MODEL (a model reference:
    a folder, a .gguf, zoo:NAME, smollm2, ...).

    full: no cache, every step recomputes the sequence; cached: visible prefill + cached decode;
    split: guide restored from a prefix pack, prompt prefilled after it; concat: the split's exact
    tokens fed visibly. Same seed and sampler on every path. For each pair and seed: identical,
    or the first divergence step with argmax agreement, top-25 overlap, max |logit diff| and
    total-variation distance of the post-top-p distributions; the same for greedy decoding.
    Summaries give Wilson intervals and say when there are too few seeds for a rate.
    """
    from kvbridge.cli.options import open_model, read_guide_and_prompt, unescape
    from kvbridge.models.fingerprint import loaded_tokenizer_identity
    from kvbridge.prefix.diverge import diverge as run

    guide_text, prompt_text = read_guide_and_prompt(guide, prompt)
    loaded = open_model(model, tokenizer, dtype=dtype, device=device)
    m, tok = loaded.model, loaded.tokenizer
    pack = None
    if pack_dir:
        from kvbridge.prefix.packs import load_pack

        pack = load_pack(pack_dir, m, tokenizer=tok, tokenizer_fp=loaded_tokenizer_identity(loaded, tokenizer))
    from kvbridge.progress import PartialLog, Progress

    settings = settings_from(DivergeSettings, {**options, "sep": unescape(options["sep"])})
    head = dict(command="diverge", model=model, seeds=settings.seeds, max_new_tokens=settings.max_new_tokens)
    partial = None if partial_path is None else PartialLog(partial_path, {**head, "paths": options["paths"]})
    bar = Progress((0 if settings.greedy_only else settings.seeds) + 1, label="diverge", unit="runs (seeds + greedy)")
    report = run(
        m,
        tok,
        guide_text,
        prompt_text,
        settings,
        pack=pack,
        progress=lambda done, total, toks: bar.update(done, tokens=toks),
        on_seed=None if partial is None else lambda seed, res: partial.add({"seed": seed, "pairs": res}),
    )
    bar.close()
    if partial is not None:
        partial.finish()
    echo_result(report.to_dict(), as_json, report.lines)
