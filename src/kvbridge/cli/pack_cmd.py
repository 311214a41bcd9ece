"""``kvbridge pack``: prefix packs saved once and restored with zero forward passes."""

from __future__ import annotations

import click

from kvbridge.cli.options import echo_result, json_option, loading_options, open_model
from kvbridge.safe_text import escape

#: what ``pack verify`` checks, in its order (the JSON's ``checks``)
CHECKS = ("checksum", "model", "rope", "cache_format", "dtype", "config", "weights", "tokenizer", "guide_token_ids")


@click.group("pack")
def pack() -> None:
    """Prefix packs: a guide's KV cache prefilled once, restored with no forward pass.

    A pack is DIR/kv.safetensors + DIR/manifest.json (schema manifests/schemas/prefix-pack.schema.json),
    versioned against the model, weights, tokenizer, guide token ids, dtype, RoPE configuration and
    cache format.
    """


@pack.command("save")
@click.argument("model")
@click.option("--guide", required=True, help="Guide text, or @FILE.")
@click.option("--out", "out", required=True, type=click.Path(), help="Pack folder to write.")
@loading_options
@click.option("--overwrite", is_flag=True, help="Replace an existing pack folder.")
def save(
    model: str, guide: str, out: str, tokenizer: str | None, dtype: str | None, device: str, overwrite: bool
) -> None:
    """Prefill GUIDE once with MODEL and write the pack to OUT.

    MODEL is a model reference: a folder, a .gguf file, zoo:NAME, smollm2, a hub id in the local
    Hugging Face cache (see `kvbridge describe --help`).

    The guide is encoded as the ghost of a split (with the tokenizer's BOS). Nothing is written
    when anything is wrong (empty guide, guide longer than the model's positions, OUT exists).
    """

    from kvbridge.artifacts import check_replaceable
    from kvbridge.models.fingerprint import loaded_tokenizer_identity
    from kvbridge.models import resolve
    from kvbridge.prefix.packs import PACK_KIND, guide_ids_of, model_reference, save_pack
    from kvbridge.prefix.splits import read_text_arg

    text = read_text_arg(guide, "guide")
    check_replaceable(out, PACK_KIND, overwrite=overwrite)  # a pack only ever replaces a pack kvbridge wrote
    resolve(model)  # a bad reference fails before anything is loaded
    loaded = open_model(model, tokenizer, dtype=dtype, device=device)
    m, tok = loaded.model, loaded.tokenizer
    ids = guide_ids_of(tok, text)
    path = save_pack(
        m,
        out,
        guide_text=text,
        guide_ids=ids,
        tokenizer=tok,
        model_dir=loaded.ref.folder,
        tokenizer_fp=loaded_tokenizer_identity(loaded, tokenizer),
        overwrite=overwrite,
        reference=model_reference(loaded.ref),
    )
    click.echo(
        f"wrote {path}: {len(ids)} guide tokens, {m.config.model_type}, "
        f"{str(next(m.parameters()).dtype).removeprefix('torch.')}"
    )


@pack.command("info")
@click.argument("folder", type=click.Path())
@json_option(help="Machine-readable output (the manifest + checks).")
def info(folder: str, as_json: bool) -> None:
    """Show a pack's manifest; the tensor file's checksum is verified."""
    from kvbridge.prefix.packs import read_pack

    manifest, tensors = read_pack(folder)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    data = {"manifest": manifest, "checksum_ok": True, "tensor_bytes": size}
    echo_result(data, as_json, lambda: _info_lines(folder, manifest, size), ensure_ascii=False)


def _info_lines(folder: str, manifest: dict, size: int) -> list[str]:
    from kvbridge.prefix.packs import origin_of

    m, g = manifest["model"], manifest["guide"]
    m = {k: escape(v) if isinstance(v, str) else v for k, v in m.items()}  # file text: controls escaped
    rev = f"@{m['revision']}" if m.get("revision") else ""
    text = g.get("text") or ""
    tfp = manifest["tokenizer"].get("fingerprint")
    pos, cf = manifest["positional"], manifest["cache_format"]
    rope = pos.get("rope") or {}
    return [
        f"pack {folder} (schema {manifest['schema_version']}, kvbridge {manifest['kvbridge_version']})",
        f"  model      {m['id']}{rev} ({m['model_type']}, {m['num_layers']} layers, {m['num_kv_heads']} kv "
        f"heads x {m['head_dim']})",
        f"  weights    sha256:{m['weights_fingerprint'][:16]}  config sha256:{m['config_fingerprint'][:16]}",
        f"  tokenizer  {'sha256:' + escape(tfp[:16]) if tfp else 'not recorded'} "
        f"({escape(manifest['tokenizer'].get('kind', ''))})",
        f"  guide      {g['num_tokens']} tokens, positions {manifest['positions']['start']}.."
        f"{manifest['positions']['stop'] - 1}: {text[:60]!r}{'...' if len(text) > 60 else ''}",
        f"  origin     {origin_of(manifest)}",
        f"  positions  {pos['kind']}" + (f" ({rope.get('type')}, theta {rope.get('theta')})" if rope else ""),
        f"  cache      {cf['cache_class']} [{cf['layout']}], keys {cf['keys']}, {manifest['dtype']}, {size / 1e6:.2f} MB",
        f"  versions   transformers {manifest['transformers_version']}, torch {manifest['torch_version']}",
        "  checksum   ok",
    ]


@pack.command("verify")
@click.argument("folder", type=click.Path())
@click.argument("model")
@loading_options
@click.option(
    "--force",
    is_flag=True,
    help="Load despite forceable differences (weights, config, tokenizer, guide ids, dtype), with a loud warning.",
)
@click.option("--recompute", is_flag=True, help="Also prefill the guide and compare it with the stored K/V.")
@json_option
def verify(
    folder: str,
    model: str,
    tokenizer: str | None,
    dtype: str | None,
    device: str,
    force: bool,
    recompute: bool,
    as_json: bool,
) -> None:
    """Check that the pack in FOLDER fits MODEL: checksum, model, weights, tokenizer, guide ids,
    dtype, RoPE configuration, cache format. A mismatch is refused naming the field (exit 2)."""
    import time
    import warnings
    from kvbridge.models.fingerprint import loaded_tokenizer_identity
    from kvbridge.prefix.packs import PackForceWarning, load_pack, read_pack, recompute_check

    read_pack(folder)  # checksum + manifest shape before loading a model
    loaded = open_model(model, tokenizer, dtype=dtype, device=device)
    m, tok = loaded.model, loaded.tokenizer
    fp = loaded_tokenizer_identity(loaded, tokenizer)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PackForceWarning)  # echoed below, once, on stderr
        loaded = load_pack(folder, m, tokenizer=tok, tokenizer_fp=fp, force=force)
    cache = loaded.cache(m)
    secs = time.perf_counter() - t0
    result = {
        "ok": not loaded.forced,
        "forced": loaded.forced,
        "forced_fields": [x.field for x in loaded.mismatches],
        "approximate": bool(loaded.state.approximate),
        "num_tokens": loaded.num_tokens,
        "cache_tokens": int(cache.get_seq_length()),
        "load_seconds": secs,
        "checks": list(CHECKS),
        "notes": list(loaded.notes),
    }
    if loaded.forced:
        click.echo(loaded.notes[0], err=True)
    if recompute:
        result["recompute_max_abs_diff"] = recompute_check(loaded, m)
    status = "LOADED WITH --force (not exact)" if loaded.forced else "ok"
    if loaded.state.approximate and not loaded.forced:
        status = "ok (an approximate cache: not this model's own prefill)"
    lines = [
        f"pack {folder} vs {model}: {status}",
        f"  checked: {', '.join(result['checks'])}",
        f"  restored {result['cache_tokens']} cached tokens with zero forward passes in {secs * 1000:.1f} ms",
    ]
    if recompute:
        lines.append(f"  recompute: max |stored - fresh prefill| = {result['recompute_max_abs_diff']:.3g}")
    echo_result(result, as_json, lines + [f"  note: {note}" for note in loaded.notes[1 if loaded.forced else 0 :]])


@pack.command("export")
@click.argument("folder", type=click.Path())
@click.option(
    "--engine",
    "engine_name",
    default="llamacpp",
    show_default=True,
    help="Inference engine whose saved-cache format to write (`kvbridge plugins` lists engines).",
)
@click.option(
    "--model",
    "model",
    help="The model the engine runs (for llamacpp: its .gguf file, or a reference resolving to one; for vllm: the "
    "safetensors folder vLLM serves); default: the model the pack was saved with, when the engine runs it. Give it "
    "for another file of the same weights.",
)
@click.option(
    "--out", "out", required=True, type=click.Path(), help="State file to write (atomically); vllm: the store folder."
)
@click.option(
    "--cache-type",
    default="F16",
    show_default=True,
    type=click.Choice(["F16", "F32", "BF16"]),
    help="Cache element type of the engine's context (llama.cpp's default is F16).",
)
@click.option(
    "--flash-attn/--no-flash-attn",
    default=False,
    show_default=True,
    help="The engine context runs flash attention (llama.cpp then stores V untransposed).",
)
@json_option
def export(
    folder: str, engine_name: str, model: str, out: str, cache_type: str, flash_attn: bool, as_json: bool
) -> None:
    """Write the pack in FOLDER as the engine's own saved cache, for the engine to continue from.

    For llamacpp the file is a llama.cpp sequence state (llama_state_seq_load_file, version 3):
    rows rounded once to --cache-type, keys in llama.cpp's rotary layout, the guide's token ids and
    positions. The pack's checksum is verified; its geometry, RoPE table and token ids are checked
    against MODEL (llama.cpp's state holds no weights identity: `kvbridge pack verify` checks those).
    Without --model, MODEL is the model the pack was saved with (as `pack save` recorded it), when it
    resolves here to a file the engine runs. No model weights are loaded and no forward pass runs. For
    vllm (plugin kvbridge-vllm) OUT is the prefix store folder the KVBridgeConnector reads (--cache-type
    and --flash-attn do not apply).
    """
    import time

    from kvbridge.errors import ConfigError, KVBridgeError
    from kvbridge.plugins import get_host
    from kvbridge.prefix.packs import read_pack_state, recorded_model

    engine = get_host().get("engine", engine_name)
    t0 = time.perf_counter()
    manifest, state = read_pack_state(folder)
    recorded = model is None
    if recorded:  # the pack's own model, when the engine runs it
        model = recorded_model(manifest, folder)
    try:
        data = engine.export_state(state, model, out, cache_type=cache_type, v_trans=not flash_attn)
    except KVBridgeError as exc:
        if not recorded:
            raise
        raise ConfigError(
            f"pack {folder} was saved with model {model!r}, which {engine_name} cannot run ({exc.what})",
            "pass --model: the same weights as the file the engine runs (for llamacpp: its .gguf)",
        ) from None
    secs = time.perf_counter() - t0
    result = {
        "pack": folder,
        "engine": engine_name,
        "model": model,
        "out": out,
        "bytes": len(data),
        "tokens": state.num_tokens,
        "approximate": bool(state.approximate),
        "cache_type": cache_type,
        "v_trans": not flash_attn,
        "seconds": secs,
    }
    echo_result(
        result,
        as_json,
        f"wrote {out}: {state.num_tokens} guide tokens as a {engine_name} state for {model} "
        f"({len(data) / 1e6:.2f} MB, {cache_type}, {'V transposed' if not flash_attn else 'V row-major'}"
        f"{', approximate' if state.approximate else ''}) in {secs * 1000:.1f} ms",
    )
