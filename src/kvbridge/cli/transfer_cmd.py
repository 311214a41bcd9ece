"""``kvbridge transfer``: prefill SOURCE, move its cache through a mapping, continue on TARGET."""

from __future__ import annotations

import time

import click

from kvbridge.cli.numbers import count
from kvbridge.cli.options import dtype_option


@click.command("transfer")
@click.argument("source")
@click.argument("target")
@click.option("--mapping", "mapping_dir", required=True, type=click.Path(), help="Mapping folder from `kvbridge fit`.")
@click.option("--prompt", required=True, help="Prompt text (or @FILE); SOURCE prefills it, TARGET continues.")
@click.option("--max-new-tokens", type=count(1), default=32, show_default=True, help="Tokens TARGET generates (greedy).")
@click.option("--compare/--no-compare", default=False, show_default=True,
              help="Also run TARGET natively: token agreement, next-token KL and timings.")
@dtype_option
@click.option("--accept-fingerprint-mismatch", "accept_mismatch", is_flag=True,
              help="Use a mapping whose fingerprints do not match the models (warns instead of refusing).")
@click.option("--force", "force_alias", is_flag=True, hidden=True,
              help="Deprecated alias of --accept-fingerprint-mismatch.")
def transfer(source, target, mapping_dir, prompt, max_new_tokens, compare, dtype, accept_mismatch, force_alias):
    """Continue TARGET from SOURCE's cache of --prompt, through a fitted --mapping.

    SOURCE and TARGET are model references (folders, .gguf files, zoo:NAME, smollm2, hub ids in
    the local Hugging Face cache; see `kvbridge describe --help`).

    Strip SOURCE's RoPE, map (batched, float32), apply TARGET's RoPE at the same positions,
    inject, and let TARGET generate (the last prompt token is withheld and consumed by
    TARGET). The mapping is refused when its fingerprints do not match the two models
    (naming the field) unless --accept-fingerprint-mismatch. A transferred cache is approximate, never an exact
    prefix cache of TARGET.
    """
    import warnings

    if force_alias:
        click.echo("warning: --force is deprecated; use --accept-fingerprint-mismatch", err=True)
    force = accept_mismatch or force_alias

    import torch

    from kvbridge.cli.options import load_pair
    from kvbridge.errors import ConfigError
    from kvbridge.fit.artifact import load_mapping
    from kvbridge.handoff import generate
    from kvbridge.plugins import get_host
    from kvbridge.transfer import transfer as run_transfer

    from kvbridge.cli.numbers import check_generation_length, max_positions_of
    from kvbridge.prefix.splits import read_text_arg

    prompt = read_text_arg(prompt, "prompt")  # @FILE, and text that is not UTF-8 refused naming --prompt
    host = get_host()
    pair = load_pair(source, target, dtype=dtype, target_tokenizer=False, host=host)
    tok_fp, smodel, tok, tmodel = pair.tokenizer, pair.source.model, pair.source.tokenizer, pair.target.model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mapping = load_mapping(mapping_dir, source=smodel, target=tmodel, tokenizer=tok_fp, force=force, host=host)
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    ids = torch.tensor([tok(prompt)["input_ids"]], dtype=torch.long)
    if ids.shape[1] < 2:
        raise ConfigError("the prompt gives fewer than 2 tokens: there is no prefix to transfer",
                          "pass a longer --prompt")
    check_generation_length(ids.shape[1], 0, max_positions_of(smodel))  # SOURCE prefills the prompt
    check_generation_length(ids.shape[1], max_new_tokens, max_positions_of(tmodel))  # TARGET continues it
    sad = host.adapter_for(smodel.config.to_dict())
    with torch.no_grad():
        t0 = time.perf_counter()
        state = sad.extract(smodel, ids[:, :-1])
        t1 = time.perf_counter()
        moved = run_transfer(state, mapping, mapping.target_spec, host=host)
        t2 = time.perf_counter()
        gen = dict(max_new_tokens=max_new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True,
                   pad_token_id=getattr(tok, "pad_token_id", None) or getattr(tok, "eos_token_id", None) or 0)
        ours = generate(tmodel, moved, ids, host=host, **gen)
    text = tok.decode(ours.sequences[0, ids.shape[1]:], skip_special_tokens=True)
    click.echo(text)
    r2 = (mapping.manifest.get("r2_summary") or {}).get("mean")
    click.echo(f"[transferred {state.num_tokens} tokens: source prefill {1e3 * (t1 - t0):.1f} ms, "
               f"mapping {1e3 * (t2 - t1):.1f} ms; mapping held-out R² "
               f"{'n/a' if r2 is None else f'{r2:.4f}'}]", err=True)
    if compare:
        with torch.no_grad():
            t3 = time.perf_counter()
            tmodel(input_ids=ids[:, :-1], use_cache=True)
            t4 = time.perf_counter()
            native = tmodel.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen)
        n = min(len(ours.logits), len(native.logits))
        same = int((ours.sequences[0, ids.shape[1]:ids.shape[1] + n] == native.sequences[0, ids.shape[1]:ids.shape[1] + n]).sum())
        from kvbridge.divergence import kl as kl_of

        kl = float(kl_of(native.logits[0].float(), ours.logits[0].float()))
        click.echo("native: " + tok.decode(native.sequences[0, ids.shape[1]:], skip_special_tokens=True))
        click.echo(f"[agreement {same}/{n} greedy tokens; next-token KL(native || transferred) {kl:.3e}; "
                   f"target prefill {1e3 * (t4 - t3):.1f} ms vs mapping {1e3 * (t2 - t1):.1f} ms]")
