"""``kvbridge describe MODEL``: the KV geometry (ModelSpec) of one model, from its config alone.

Config-only: imports neither torch nor transformers.
"""

from __future__ import annotations

import json

import click

from kvbridge.cli.options import echo_result, fmt_rope, json_option, kv_bytes_per_token
from kvbridge.safe_text import escape
from kvbridge.sizes import fmt_size


def describe_dict(resolved, spec) -> dict:
    """The ``--json`` shape of ``describe``."""
    from kvbridge.check.compat import cache_format_of

    tok = resolved.tokenizer()
    return {
        "ref": resolved.ref,
        "name": resolved.name,
        "kind": resolved.kind,
        "path": resolved.path,
        "spec": spec.to_dict(),
        "cache_format": cache_format_of(spec, resolved.config, resolved.generation_config),
        "kv_bytes_per_token": kv_bytes_per_token(spec),
        "tokenizer": tok.to_dict() if tok is not None else "unknown",
        **({"gguf": resolved.gguf.summary()} if resolved.gguf is not None else {}),
        "load_memory": load_memory(resolved),
    }


def load_memory(resolved) -> dict | None:
    """Bytes of the weights once loaded, per dtype: counted from a GGUF's tensors, else estimated
    from the config (:func:`kvbridge.fit.plan.model_size`); None when the config cannot say."""
    if resolved.gguf is not None:
        params, how = resolved.gguf.params, "counted from the GGUF tensors"
    else:
        try:
            from kvbridge.fit.plan import model_size

            params, how = model_size(resolved.ref).params, "estimated from the config"
        except Exception:  # noqa: BLE001 - a manifest without sizes: describe shows no estimate
            return None
    return {"params": int(params), "how": how, "float32": 4 * int(params), "bfloat16": 2 * int(params)}


def _human(data: dict) -> str:
    spec = data["spec"]
    kinds = spec["layer_types"]
    n_sliding = sum(1 for k in kinds if k == "sliding_attention")
    others = {k for k in kinds if k not in ("full_attention", "sliding_attention")}
    if others:  # chunked / recurrent / shared-KV layers: count every kind
        from collections import Counter

        names = {
            "sliding_attention": f"sliding (window {spec['sliding_window']})",
            "full_attention": "full",
            "chunked_attention": f"chunked ({spec.get('attention_chunk_size')}; cached as a sliding window "
            f"of {spec.get('attention_chunk_size')})",
            "linear_attention": "recurrent",
            "conv": "conv",
            "shared_kv": "shared-KV",
            "no_attention": "no attention",
        }
        attention = "mixed: " + " + ".join(f"{n} {names.get(k, k)}" for k, n in Counter(kinds).items())
    elif not n_sliding:
        attention = "full"
    elif n_sliding == len(kinds):
        attention = f"sliding window {spec['sliding_window']} on every layer"
    else:
        attention = f"hybrid: {n_sliding} sliding (window {spec['sliding_window']}) + {len(kinds) - n_sliding} full"
    heads, kv = spec["num_attention_heads"], spec["num_kv_heads"]
    head_kind = "MHA" if heads == kv else ("MQA" if kv == 1 else f"GQA {heads // kv}:1")
    rope = fmt_rope(dict(spec["rope"], by_layer_type=spec.get("rope_by_layer_type"))) if spec["rope"] else "-"
    if spec["rope"] and spec["rope"].get("partial_factor", 1.0) != 1.0:
        rope += f" (rotary_dim {spec['rope']['rotary_dim']} of {spec['rope']['head_dim']})"
    gguf = data.get("gguf")
    dtype = spec["dtype"]
    if gguf:  # what the dequantized model loads as, and what the file holds
        dtype += f" as loaded (weights {gguf.get('file_type') or gguf['quantization']}, dequantized)"
    vdim = spec.get("value_head_dim")  # MLA: cached values narrower or wider than keys
    head_dims = (
        str(spec["head_dim"])
        if vdim is None or vdim == spec["head_dim"]
        else f"K {spec['head_dim']}, V {vdim} (keys and values have their own widths)"
    )
    tok = data["tokenizer"]
    tok_text = "unknown" if tok == "unknown" else f"{tok['kind']} {tok['vocab_size']} ids sha256:{tok['digest'][:12]}"
    rows = [
        ("model_type", f"{spec['model_type']} (adapter {spec['family']})"),
        ("layers", str(spec["num_layers"])),
        ("attention heads", str(heads)),
        ("KV heads (cached)", f"{kv} ({head_kind})"),
        ("head_dim", head_dims),
        ("hidden_size", str(spec["hidden_size"])),
        ("positional", spec["positional"]),
        ("rope", rope),
        ("attention", attention),
        ("qk_norm", "yes" if spec["qk_norm"] else "no"),
        ("dtype", dtype),
        ("vocab_size", str(spec["vocab_size"])),
        ("max positions", str(spec["max_position_embeddings"])),
        ("cache_format", data["cache_format"]),
        ("KV bytes / token", f"{data['kv_bytes_per_token']:,}"),
        ("tokenizer", tok_text),
    ]
    if gguf:
        types = ", ".join(f"{k} x{v}" for k, v in sorted(gguf["tensor_types"].items(), key=lambda kv: -kv[1]))
        stated = gguf.get("file_type")
        if stated and stated != gguf["quantization"]:
            quant = f"{gguf['quantization']} by tensor count ({types}); the file states {stated}"
        else:
            quant = f"{gguf['quantization']} ({types})" + (" (as the file states)" if stated else "")
        file = f"{fmt_size(gguf['size'])}, GGUF v{gguf['version']}, arch {gguf['architecture']}"
        rows += [
            ("gguf file", f"{file}, {gguf['tensors']} tensors"),
            ("quantization", quant),
            ("tied embeddings", "yes" if gguf["tied_embeddings"] else "no"),
            ("chat template", "yes" if gguf["chat_template"] else "no"),
        ]
    mem = data.get("load_memory")
    if mem:
        params = f"{mem['params'] / 1e6:,.{0 if mem['params'] >= 1e7 else 2}f}M params ({mem['how']})"
        sizes = f"{fmt_size(mem['float32'])} in float32, {fmt_size(mem['bfloat16'])} in bfloat16 (--dtype)"
        rows.append(("weights in memory", f"{params}: {sizes}, before activations"))
    rows += _per_layer_rows(spec)
    for key, value in sorted((spec.get("extras") or {}).items()):
        rows.append((key, json.dumps(value) if isinstance(value, (list, dict)) else str(value)))
    width = max(len(k) for k, _ in rows)
    lines = [click.style(escape(data["name"]), bold=True) + f"  ({data['kind']}: {escape(data['path'])})"]
    lines += [f"  {k:<{width}}  {escape(v)}" for k, v in rows]
    return "\n".join(lines)


def _per_layer_rows(spec: dict) -> list[tuple[str, str]]:
    """Rows for the per-layer facts (only those a spec sets)."""
    rows = []
    size = spec.get("attention_chunk_size")
    if size:
        n = spec["layer_types"].count("chunked_attention")
        rows.append(("chunked layers", f"{n} (chunk {size}; transformers caches them as a sliding window of {size})"))
    facts = dict(spec, no_kv_other=sorted(set(spec.get("no_kv_layers") or []) - set(spec.get("state_layers") or [])))
    for key, name, note in (
        ("nope_layers", "NoPE layers", " (keys carry no RoPE)"),
        ("kv_shared_layers", "shared-KV layers", " (reuse an earlier layer's KV)"),
        ("state_layers", "recurrent layers", " (recurrent/conv state, cannot be mapped)"),
        ("no_kv_other", "no-KV layers", ""),
        ("layer_head_dims", "per-layer head dims", ""),
        ("layer_kv_heads", "per-layer KV heads", ""),
    ):
        if facts.get(key):
            rows.append((name, f"{facts[key]}{note}"))
    if spec.get("cache_format") == "mla":
        lat = spec.get("latent") or {}
        slots = f"rank {lat.get('kv_lora_rank')} (K slot) + shared RoPE key {lat.get('qk_rope_head_dim')} dims (V slot)"
        rows.append(("MLA latent", f"{slots}; per-head K/V are recomputed"))
    elif spec.get("value_head_dim"):
        rows.append(("value head_dim", str(spec["value_head_dim"])))
    if spec.get("indexer_layers"):
        ix = spec.get("indexer") or {}
        lo, hi = ix.get("rope_offset", 0), ix.get("rope_offset", 0) + ix.get("rope_dim", 0)
        what = f"1 x {ix.get('head_dim')} per token (sparse attention top-k), RoPE on dims {lo}:{hi} half-split"
        rows.append(("indexer keys", f"layers {spec['indexer_layers']}: {what}; carried, never mapped"))
    return rows


def _list(host, as_json: bool) -> None:
    from kvbridge.check.sources import describe_config, load_manifests

    rows = []
    for mid, (record, path) in sorted(load_manifests(host).items(), key=lambda kv: kv[0].lower()):
        spec = describe_config(record["config"], where=str(path), host=host)
        geometry = {k: getattr(spec, k) for k in ("model_type", "num_layers", "num_kv_heads", "head_dim", "positional")}
        rows.append(
            {"id": mid, "family": record["family"], **geometry, "aliases": record.get("aliases", []), "path": str(path)}
        )
    w = max([len("id")] + [len(r["id"]) for r in rows])
    lines = [click.style(f"  {'id':<{w}}  {'family':<10} layers  kv  head_dim  positional", bold=True)] + [
        f"  {escape(r['id']):<{w}}  {escape(r['family']):<10} {r['num_layers']:>6}  {r['num_kv_heads']:>2}"
        f"  {r['head_dim']:>8}  {r['positional']}"
        for r in rows
    ]
    echo_result(rows, as_json, lines)


@click.command("describe")
@click.argument("model", metavar="[MODEL]", required=False)
@json_option(
    help="Print JSON: {ref, name, kind, path, spec, cache_format, kv_bytes_per_token, tokenizer, "
    "gguf (GGUF files only), load_memory}."
)
@click.option(
    "--list", "list_models", is_flag=True, help="List the models known from manifests (MODEL is then not needed)."
)
def describe(model: str | None, as_json: bool, list_models: bool) -> None:
    """Show the KV-cache geometry of MODEL, read from its config alone (no weights, no torch).

    MODEL is a model folder (save_pretrained), a .gguf file (or a folder holding one), a
    config.json, a hub id already in the local Hugging Face cache (never downloaded), a
    manifest name (--list), zoo:NAME, a short name such as smollm2 (`kvbridge models`), or
    SCHEME:REST for schemes plugins register. A GGUF is read from its header only (no
    tensor), with its quantization (the type most tensors have, and the file's stated type
    general.file_type beside it when they differ), tied embeddings and chat template shown.
    The weights' memory once loaded is given in float32 and bfloat16 (counted from a GGUF's
    tensors, else estimated from the config).

    Shows layers, attention and KV heads as cached, head_dim, positions (RoPE type, theta,
    scaling, partial factor, interleaving, per-layer-type tables), sliding windows and layer
    types, dtype, cache format, KV bytes per token and the tokenizer fingerprint when
    tokenizer files are present. Exit status 2 on bad input.
    """
    from kvbridge.errors import ConfigError
    from kvbridge.plugins import get_host
    from kvbridge.models.resolve import resolve

    host = get_host()
    if list_models:
        _list(host, as_json)
        return
    if not model:
        raise ConfigError("missing MODEL", "pass a model folder, a config.json, or a name from --list")
    resolved = resolve(model, host=host)
    data = describe_dict(resolved, resolved.spec(host))
    click.echo(json.dumps(data, indent=2, default=str) if as_json else _human(data))
