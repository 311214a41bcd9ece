"""``kvbridge engine``: caches saved by an inference engine, read back as kvbridge states."""

from __future__ import annotations

import json

import click

from kvbridge.cli.options import json_option


@click.group("engine")
def engine() -> None:
    """Inference engines' saved caches (llama.cpp sequence states, ...) as KV states.

    Engines are plugins (hook kvbridge_register_engines); `kvbridge plugins` lists them. To write
    one: `kvbridge pack export PACK --engine NAME --model MODEL --out FILE`.
    """


@engine.command("import")
@click.argument("file", type=click.Path())
@click.argument("model")
@click.option("--engine", "engine_name", default="llamacpp", show_default=True, help="The engine that saved FILE.")
@json_option
def import_cmd(file: str, model: str, engine_name: str, as_json: bool) -> None:
    """Read FILE, a cache the engine saved while running MODEL, as a KV state and describe it.

    For llamacpp FILE is a llama.cpp sequence state (llama_state_seq_save_file, version 3) and
    MODEL the .gguf the context ran. The header, cell count, cache types, layer count and every
    layer's row widths are checked against MODEL; a file of another llama.cpp version, a
    truncated file or a file for another model is refused in one line.
    """
    from kvbridge.engines import get_engine

    eng = get_engine(engine_name)
    describe = getattr(eng, "describe_file", None)
    if describe is None:
        state = eng.import_state(file, model)
        info = {"file": file, "kv_state": {"layers": state.num_layers, "tokens": state.num_tokens}}
    else:
        info = describe(file, model)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    kv = info["kv_state"]
    click.echo(
        f"{file}: {info.get('format', engine_name)} version {info.get('version', '?')} for {info.get('model', model)}"
    )
    if "cells" in info:
        click.echo(
            f"  cache      {info['cells']} cells, {info['layers']} layers, K {info['k_type']} x {info['k_row']}, "
            f"V {info['v_type']} x {info['v_row']}{' (transposed)' if info.get('v_trans') else ''}, "
            f"{info['n_stream']} stream(s)"
        )
    click.echo(
        f"  KV state   {kv['layers']} layers x {kv.get('kv_heads', '?')} KV heads x {kv.get('head_dim', '?')}, "
        f"{kv['tokens']} tokens at positions {kv.get('positions')}, {kv.get('dtype', '')}, "
        f"keys {'with' if kv.get('rope_applied') else 'without'} RoPE ({kv.get('model_type', '')} layout), "
        f"{kv.get('bytes', 0) / 1e6:.2f} MB"
    )
