"""``kvbridge transfer``: prefill SOURCE, move its cache through a mapping, continue on TARGET."""

from __future__ import annotations

import time

import click

from kvbridge.cli.numbers import count
from kvbridge.cli.options import dtype_option


@click.command("transfer")
@click.argument("source")
@click.argument("target")
@click.option("--mapping", "mapping_dir", required=True, type=click.Path(),
              help="Mapping folder from `kvbridge fit`, or `identity` (SOURCE and TARGET the same model: the exact baseline).")
@click.option("--prompt", required=True, help="Prompt text (or @FILE); SOURCE prefills it, TARGET continues.")
@click.option("--max-new-tokens", type=count(1), default=32, show_default=True, help="Tokens TARGET generates (greedy).")
@click.option("--compare/--no-compare", default=False, show_default=True,
              help="Also run TARGET natively: token agreement, next-token KL and timings.")
@click.option("--engine", "engine_name", default=None,
              help="Continue in an inference engine instead of transformers (llamacpp: TARGET's .gguf runs in "
                   "llama.cpp from the transferred cache; `kvbridge plugins` lists engines).")
@dtype_option
@click.option("--accept-fingerprint-mismatch", "accept_mismatch", is_flag=True,
              help="Use a mapping whose fingerprints do not match the models (warns instead of refusing).")
@click.option("--force", "force_alias", is_flag=True, hidden=True,
              help="Deprecated alias of --accept-fingerprint-mismatch.")
def transfer(source, target, mapping_dir, prompt, max_new_tokens, compare, engine_name, dtype, accept_mismatch,
             force_alias):
    """Continue TARGET from SOURCE's cache of --prompt, through a fitted --mapping.

    SOURCE and TARGET are model references (folders, .gguf files, zoo:NAME, smollm2, hub ids in
    the local Hugging Face cache; see `kvbridge describe --help`).

    Strip SOURCE's RoPE, map (batched, float32), apply TARGET's RoPE at the same positions,
    inject, and let TARGET generate (the last prompt token is withheld and consumed by
    TARGET). The mapping is refused when its fingerprints do not match the two models
    (naming the field) unless --accept-fingerprint-mismatch. A transferred cache is approximate, never an exact
    prefix cache of TARGET.

    With --engine llamacpp the transferred cache is written in llama.cpp's sequence-state format and
    TARGET's .gguf continues from it in llama.cpp (--compare: against llama.cpp's own prefill).
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
        if mapping_dir == "identity":
            mapping = _identity_mapping(pair, host)
        else:
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
        moved = run_transfer(state, mapping, getattr(mapping, "target_spec", None) or pair.target.spec, host=host)
        t2 = time.perf_counter()
        if engine_name is not None:
            _continue_in_engine(engine_name, pair.target.ref, moved, ids, tok, max_new_tokens, compare,
                                source_s=t1 - t0, map_s=t2 - t1, host=host)
            return
        gen = dict(max_new_tokens=max_new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True,
                   pad_token_id=getattr(tok, "pad_token_id", None) or getattr(tok, "eos_token_id", None) or 0)
        ours = generate(tmodel, moved, ids, host=host, **gen)
    text = tok.decode(ours.sequences[0, ids.shape[1]:], skip_special_tokens=True)
    click.echo(text)
    r2 = ((getattr(mapping, "manifest", None) or {}).get("r2_summary") or {}).get("mean")
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
        click.echo(f"[speed-up {(t4 - t3) / max(t2 - t1, 1e-9):.1f}x (target prefill / mapping), "
                   f"{(t4 - t3) / max(t2 - t0, 1e-9):.2f}x counting the source prefill "
                   f"(target prefill / (source prefill + mapping))]")


def _continue_in_engine(name, target_ref, moved, ids, tok, max_new_tokens, compare, *, source_s, map_s, host):
    """TARGET continues in the engine from the transferred cache; prints the text and the timings."""
    from kvbridge.engines import get_engine
    from kvbridge.errors import PluginError

    engine = get_engine(name, host=host)
    run = getattr(engine, "continue_from", None)
    if not callable(run):
        raise PluginError(f"engine {name!r} can export a cache but cannot continue from one here",
                          "use `kvbridge pack export --engine NAME` and load the file in the engine yourself")
    out = run(moved, target_ref, ids[0, -1:].tolist(), max_new_tokens, native=compare, host=host)
    click.echo(tok.decode(out["tokens"], skip_special_tokens=True))
    click.echo(f"[{name}: transferred {moved.num_tokens} tokens: source prefill {1e3 * source_s:.1f} ms, mapping "
               f"{1e3 * map_s:.1f} ms, export {1e3 * out['export_s']:.1f} ms ({out['bytes']:,} bytes), engine load "
               f"{1e3 * out['load_s']:.1f} ms]", err=True)
    if compare:
        n = min(len(out["tokens"]), len(out["native_tokens"]))
        same = sum(int(a == b) for a, b in zip(out["tokens"][:n], out["native_tokens"][:n]))
        click.echo(f"{name} native: " + tok.decode(out["native_tokens"], skip_special_tokens=True))
        click.echo(f"[agreement {same}/{n} greedy tokens; first-step max |logit diff| vs {name}'s own prefill "
                   f"{out['first_step_diff']:.3f}; {name} prefill {1e3 * out['native_prefill_s']:.1f} ms vs "
                   f"mapping + export + load {1e3 * (map_s + out['export_s'] + out['load_s']):.1f} ms]")


def _identity_mapping(pair, host):
    """``--mapping identity``: the built-in exact mapping, for a pair that is one model (same weights)."""
    from kvbridge.builtin.identity import IdentityFitter
    from kvbridge.errors import ConfigError

    if not pair.same_model:
        raise ConfigError(f"--mapping identity needs SOURCE and TARGET to be one model; {pair.source.name} and "
                          f"{pair.target.name} differ", "fit a mapping for this pair (kvbridge fit) and pass its folder")
    return IdentityFitter().fit(pair.source.spec, pair.target.spec)
