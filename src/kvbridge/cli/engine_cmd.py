"""``kvbridge engine``: caches saved by an inference engine, read back as kvbridge states."""

from __future__ import annotations

import click

from kvbridge.cli.options import echo_result, json_option


@click.group("engine")
def engine() -> None:
    """Inference engines' saved caches (llama.cpp sequence states, vLLM prefix stores, ...) as KV states.

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
    truncated file or a file for another model is refused in one line. For vllm FILE is an entry
    of a prefix store (one the KVBridgeConnector saved with kvbridge_save, or one kvbridge wrote) and
    MODEL the safetensors folder vLLM serves; its model fingerprint, dtype and geometry are checked.
    """
    from kvbridge.plugins import get_host

    eng = get_host().get("engine", engine_name)
    describe = getattr(eng, "describe_file", None)
    if describe is None:
        state = eng.import_state(file, model)
        info = {"file": file, "kv_state": {"layers": state.num_layers, "tokens": state.num_tokens}}
    else:
        info = describe(file, model)
    echo_result(info, as_json, lambda: _import_lines(info, file, model, engine_name))


def _import_lines(info: dict, file: str, model: str, engine_name: str) -> list[str]:
    kv = info["kv_state"]
    lines = [
        f"{file}: {info.get('format', engine_name)} version {info.get('version', '?')} for {info.get('model', model)}"
    ]
    if "approximate" in info:
        origin = (
            "approximate (transferred or steered: not the model's own exact cache)" if info["approximate"] else "exact"
        )
        lines.append(f"  origin     {info.get('provenance') or 'unknown'}, {origin}")
    if "cells" in info:
        lines.append(
            f"  cache      {info['cells']} cells, {info['layers']} layers, K {info['k_type']} x {info['k_row']}, "
            f"V {info['v_type']} x {info['v_row']}{' (transposed)' if info.get('v_trans') else ''}, "
            f"{info['n_stream']} stream(s)"
        )
    lines.append(
        f"  KV state   {kv['layers']} layers x {kv.get('kv_heads', '?')} KV heads x {kv.get('head_dim', '?')}, "
        f"{kv['tokens']} tokens at positions {kv.get('positions')}, {kv.get('dtype', '')}, "
        f"keys {'with' if kv.get('rope_applied') else 'without'} RoPE ({kv.get('model_type', '')} layout), "
        f"{kv.get('bytes', 0) / 1e6:.2f} MB"
    )
    return lines


@engine.command("export")
@click.argument("src", type=click.Path())
@click.option(
    "--engine", "engine_name", required=True, help="The engine to write for (`kvbridge plugins` lists engines)."
)
@click.option("--model", "model", required=True, help="The model the engine runs (vllm: the folder it serves).")
@click.option("--out", "out", required=True, type=click.Path(), help="Where to write (vllm: the store folder).")
@click.option(
    "--from-engine",
    "from_engine",
    help="SRC is a cache this engine saved (read with its import) instead of a pack folder.",
)
@click.option("--from-model", "from_model", default=None, help="The model SRC's engine ran (default: --model).")
@json_option
def export_cmd(
    src: str, engine_name: str, model: str, out: str, from_engine: str | None, from_model: str | None, as_json: bool
) -> None:
    """Write a saved KV state SRC as ENGINE's own cache for MODEL.

    SRC is a pack folder (what `kvbridge pack save` writes; a transferred cache saved by `transfer`
    with --save-state is one too), or with --from-engine a cache an engine saved (a llama.cpp
    sequence state, a vLLM store entry). Geometry, RoPE table and token ids are checked
    against MODEL; a transferred or steered state stays marked approximate where the engine's
    format records it (vllm). Example: `kvbridge engine export seq.bin --from-engine llamacpp
    --from-model model.gguf --engine vllm --model model-hf --out store`.
    """
    import time

    from kvbridge.plugins import get_host

    host = get_host()
    t0 = time.perf_counter()
    if from_engine:
        state = host.get("engine", from_engine).import_state(src, from_model or model)
    else:
        from kvbridge.prefix.packs import read_pack_state

        _, state = read_pack_state(src)  # a transferred pack keeps its approximate mark and provenance
    data = host.get("engine", engine_name).export_state(state, model, out)
    info = {
        "src": src,
        "engine": engine_name,
        "model": model,
        "out": out,
        "tokens": state.num_tokens,
        "bytes": len(data),
        "approximate": bool(state.approximate),
        "seconds": time.perf_counter() - t0,
    }
    echo_result(
        info,
        as_json,
        f"wrote {out}: {state.num_tokens} tokens as a {engine_name} cache for {model} ({len(data) / 1e6:.2f} MB"
        f"{', approximate' if state.approximate else ''}) in {info['seconds'] * 1000:.1f} ms",
    )
