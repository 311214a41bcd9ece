"""``kvbridge transfer``: prefill SOURCE, move its cache through a mapping, continue on TARGET."""

from __future__ import annotations

import click

from kvbridge.cli.options import dtype_option, load_pair, settings_from, settings_options
from kvbridge.transfer_settings import TransferSettings


@click.command("transfer")
@click.argument("source")
@click.argument("target")
@settings_options(TransferSettings, after={"engine": [dtype_option]})
def transfer(source, target, dtype, **options):
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

    --save-state DIR keeps the transferred cache as a pack folder for TARGET (`kvbridge pack info`
    shows where it came from); for vLLM: `kvbridge engine export DIR --engine vllm --model
    TARGET_FOLDER --out STORE`, then send the whole prompt's token ids.
    """
    from kvbridge.prefix.splits import read_text_arg
    from kvbridge.transfer_run import transfer_generate

    # @FILE; not UTF-8 refused
    settings = settings_from(TransferSettings, {**options, "prompt": read_text_arg(options["prompt"], "prompt")})
    if settings.engine is not None:  # an engine that only exports caches: refused before the models load
        from kvbridge.transfer_run import engine_continuation

        engine_continuation(settings.engine)
    if settings.save_state is not None:  # refused before the models load
        from kvbridge.artifacts import check_replaceable
        from kvbridge.prefix.packs import PACK_KIND

        check_replaceable(settings.save_state, PACK_KIND, overwrite=settings.overwrite)
    pair = load_pair(source, target, dtype=dtype, target_tokenizer=False)
    _print(transfer_generate(pair, settings), settings.compare)


def _print(res, compare: bool) -> None:
    """A :class:`~kvbridge.transfer_run.TransferResult` as the command prints it."""
    for w in res.warnings:
        click.echo(f"warning: {w}", err=True)
    if res.saved is not None:
        what = "approximate: not TARGET's own exact cache" if res.approximate else "exact: identity mapping"
        click.echo(f"[saved the transferred cache of {res.tokens} tokens to {res.saved} ({what})]", err=True)
    if res.engine is not None:
        _print_engine(res, compare)
        return
    click.echo(res.text)
    click.echo(
        f"[transferred {res.tokens} tokens: source prefill {1e3 * res.source_prefill_s:.1f} ms, "
        f"mapping {1e3 * res.map_s:.1f} ms; mapping held-out R² "
        f"{'n/a' if res.r2 is None else f'{res.r2:.4f}'}]",
        err=True,
    )
    if compare:
        src_s, map_s, tgt_s = res.source_prefill_s, res.map_s, res.target_prefill_s
        click.echo("native: " + res.native_text)
        click.echo(
            f"[agreement {res.agreement}/{res.compared} greedy tokens; next-token KL(native || transferred) "
            f"{res.kl:.3e}; target prefill {1e3 * tgt_s:.1f} ms vs mapping {1e3 * map_s:.1f} ms]"
        )
        click.echo(
            f"[speed-up {tgt_s / max(map_s, 1e-9):.1f}x (target prefill / mapping), "
            f"{tgt_s / max(src_s + map_s, 1e-9):.2f}x counting the source prefill "
            f"(target prefill / (source prefill + mapping))]"
        )


def _print_engine(res, compare: bool) -> None:
    name, out, map_s = res.engine, res.engine_run, res.map_s
    click.echo(res.text)
    click.echo(
        f"[{name}: transferred {res.tokens} tokens: source prefill {1e3 * res.source_prefill_s:.1f} ms, mapping "
        f"{1e3 * map_s:.1f} ms, export {1e3 * out['export_s']:.1f} ms ({out['bytes']:,} bytes), engine load "
        f"{1e3 * out['load_s']:.1f} ms]",
        err=True,
    )
    if compare:
        click.echo(f"{name} native: " + res.native_text)
        click.echo(
            f"[agreement {res.agreement}/{res.compared} greedy tokens; first-step max |logit diff| vs {name}'s "
            f"own prefill {out['first_step_diff']:.3f}; {name} prefill {1e3 * out['native_prefill_s']:.1f} ms "
            f"vs mapping + export + load {1e3 * (map_s + out['export_s'] + out['load_s']):.1f} ms]"
        )
