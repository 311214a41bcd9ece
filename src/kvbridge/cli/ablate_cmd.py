"""``kvbridge ablate``: K-only, V-only, K+V zeroing of the guide vs true removal."""

from __future__ import annotations

import click

from kvbridge.cli.numbers import count
from kvbridge.cli.options import echo_result, json_option, loading_options, open_model, read_guide_and_prompt, unescape


@click.command("ablate")
@click.argument("model")
@click.option("--guide", required=True, help="Guide text (the ablated prefix), or @FILE.")
@click.option("--prompt", required=True, help="Live prompt, or @FILE.")
@click.option("--sep", default=" ", show_default=True, help="Separator between guide and prompt (\\n escapes).")
@click.option("--layers", default="all", show_default=True, help="Layers: all, a list 0,2 or a range 1-3.")
@click.option(
    "--max-new-tokens", default=16, show_default=True, type=count(1), help="Length of the greedy continuation compared."
)
@loading_options
@json_option
def ablate(model, guide, prompt, sep, layers, max_new_tokens, tokenizer, dtype, device, as_json) -> None:
    """Ablate the guide's cached K/V at LAYERS and compare with the intact state and true removal.

    Conditions on the guide positions: k_zero, v_zero, kv_zero, remove_prefill (mask while the
    prompt is prefilled and after), remove_decode (mask only at decode time), recompute (no guide
    at all), each against intact: next-token KL, top-1 change, greedy agreement. A zeroed key
    still takes part in the softmax (score 0, weight exp(0)) and a kept value still contributes,
    so no zeroing equals removal; see docs/prefix-tools.md.
    """
    from kvbridge.prefix.ablate import ablate as run

    guide_text, prompt_text = read_guide_and_prompt(guide, prompt)  # an empty guide fails before the model loads
    lm = open_model(model, tokenizer, dtype=dtype, device=device)
    report = run(
        lm.model, lm.tokenizer, guide_text, prompt_text, sep=unescape(sep), layers=layers, max_new_tokens=max_new_tokens
    )
    echo_result(report.to_dict(), as_json, report.lines)
