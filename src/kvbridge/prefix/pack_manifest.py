"""A prefix pack's manifest: what it records (model and tokenizer identities, positions,
cache format, versions), its minimal shape check, and the field-by-field comparison with a
model that decides whether a pack may be loaded (see :mod:`kvbridge.prefix.packs`, which
saves and loads packs and re-exports these names).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from kvbridge.artifacts import check_kind, library_versions
from kvbridge.errors import ArtifactError, ConfigError, KVBridgeError
from kvbridge.plugins import adapter_of

# the model id / revision and the tokenizer fingerprint live in kvbridge.models.fingerprint
from kvbridge.models.fingerprint import model_config_fingerprint, model_id_revision, weights_fingerprint
from kvbridge.models.fingerprint import tokenizer_identity as tokenizer_fingerprint

SCHEMA_VERSION = 2  # 2: manifest "kv_layout" (K/V stacked in one tensor); schema 1 packs are read as before
PACK_KIND = "kvbridge.prefix-pack"
TENSOR_FILE = "kv.safetensors"
FIX = "re-create the pack with kvbridge pack save"
#: how the tensor file holds K/V (manifest ``kv_layout``): ``stacked`` is one tensor ``kv``
#: ``[layers, 2 (keys, values), batch, kv heads, tokens, head dim]`` (every layer of one shape);
#: ``layers`` is ``layers.{i}.keys`` / ``layers.{i}.values`` per layer (schema 1 packs, and models
#: whose layers differ in shape)
STACKED, PER_LAYER = "stacked", "layers"
KV_LAYOUTS = (STACKED, PER_LAYER)
#: fields that ``force=True`` may override (the state still has the right shape and meaning)
FORCEABLE = frozenset({"config", "weights", "tokenizer", "guide_token_ids", "dtype"})
#: manifest keys every pack has, with their JSON types (the schema file says the same)
REQUIRED = {
    "schema_version": int,
    "kind": str,
    "model": dict,
    "tokenizer": dict,
    "guide": dict,
    "positions": dict,
    "dtype": str,
    "cache_format": dict,
    "positional": dict,
    "transformers_version": str,
    "torch_version": str,
    "kvbridge_version": str,
    "state": dict,
    "tensor_file": str,
    "tensor_sha256": str,
}


#: the fields of :func:`model_record` that every reader needs (a steering vector's reader too)
MODEL_REQUIRED = {
    "model.model_type": str,
    "model.num_layers": int,
    "model.num_kv_heads": int,
    "model.head_dim": int,
    "model.config_fingerprint": str,
    "model.weights_fingerprint": str,
}
#: nested fields the readers use (checked by kvbridge.check.validate.require_fields)
NESTED_REQUIRED = {
    "model.id": str,
    **MODEL_REQUIRED,
    "model.spec_fingerprint": str,
    "guide.token_ids": list,
    "guide.num_tokens": int,
    "positions.start": int,
    "positions.stop": int,
    "positional.kind": str,
    "cache_format.cache_class": str,
    "cache_format.layout": str,
    "state.num_layers": int,
    "state.spec": dict,
}


# -- identities -----------------------------------------------------------------------------------
def cache_format(spec) -> dict:
    """How the cache this spec's model builds is laid out (what the pack's tensors assume)."""
    from kvbridge.spec import SLIDING

    kinds = [spec.layer_type(i) for i in range(spec.num_layers)]
    return {
        "cache_class": "DynamicCache",
        "layout": "batch,kv_heads,tokens,head_dim",
        "keys": "post_rope" if spec.positional == "rope" else "no_rotation",
        "layer_kinds": kinds,
        "layer_classes": ["DynamicSlidingWindowLayer" if k == SLIDING else "DynamicLayer" for k in kinds],
        "stored_history": "full",  # sliding layers keep every token here; injection trims
        "num_layers": spec.num_layers,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "sliding_window": spec.sliding_window if SLIDING in kinds else None,
    }


def positional_config(spec) -> dict:
    return {
        "kind": spec.positional,
        "rope": spec.rope.to_dict() if spec.rope else None,
        "rope_by_layer_type": {k: v.to_dict() for k, v in spec.rope_by_layer_type},
        "max_position_embeddings": spec.max_position_embeddings,
    }


def model_record(model, spec, *, model_dir=None, weights_fp: str | None = None, **extra) -> dict:
    """What an artifact records about the model its tensors belong to (id, revision, fingerprints,
    geometry), then ``extra`` (a pack adds the positions, a steering vector the hidden size and dtype)."""
    return {
        **model_id_revision(model, model_dir),
        "model_type": spec.model_type,
        "family": spec.family,
        "config_fingerprint": model_config_fingerprint(model),
        "weights_fingerprint": weights_fp or weights_fingerprint(model),
        "spec_fingerprint": spec.fingerprint(),
        "num_layers": spec.num_layers,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        **extra,
    }


def build_manifest(
    model,
    state,
    *,
    guide_text: str | None,
    tokenizer_fp: dict,
    model_dir=None,
    weights_fp: str | None = None,
    special_prefix=(),
    kv_layout: str = PER_LAYER,
    reference: str | None = None,
) -> dict:
    from kvbridge.kvstate_io import state_manifest

    spec = state.spec
    ids = [int(x) for x in state.token_ids[0].tolist()]
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "kind": PACK_KIND,
        "kv_layout": kv_layout,
        "model": model_record(
            model,
            spec,
            model_dir=model_dir,
            weights_fp=weights_fp,
            max_position_embeddings=spec.max_position_embeddings,
        ),
        "tokenizer": dict(tokenizer_fp),
        "guide": {
            "text": guide_text,
            "token_ids": ids,
            "num_tokens": len(ids),
            "special_prefix": [int(x) for x in special_prefix],
            "ids_sha256": hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode()).hexdigest(),
        },
        "positions": {"start": 0, "stop": len(ids), "kind": "prefix"},
        "dtype": str(state.dtype).removeprefix("torch."),
        "cache_format": cache_format(spec),
        "positional": positional_config(spec),
        **library_versions(),
        "state": state_manifest(state),
    }
    if reference:  # the model reference it was saved with (``pack export`` defaults --model to it)
        manifest["model"]["reference"] = str(reference)
    return manifest


def model_reference(ref) -> str:
    """What a pack records as its model's reference (a resolved :class:`~kvbridge.models.ModelRef`):
    a short name or scheme reference as given (``smollm2``, ``zoo:base``), else the absolute path of
    the file or folder, so it resolves from any working directory."""
    if ref.source:
        return ref.ref
    from pathlib import Path

    return str(Path(ref.gguf_file or ref.folder or ref.path).resolve())


def recorded_model(manifest: Mapping, where: str) -> str:
    """The model reference a pack was saved with, resolved here (``kvbridge pack export`` without
    ``--model``); a one-line error when the pack records none or it does not resolve."""
    from kvbridge.models import resolve

    m = manifest.get("model") or {}
    ref = m.get("reference")
    if not isinstance(ref, str) or not ref:
        raise ConfigError(
            f"pack {where} records no model reference (model id {m.get('id')!r}; saved before packs recorded one)",
            "pass --model (the file the engine runs), or save the pack again with this kvbridge",
        )
    try:
        resolve(ref)
    except KVBridgeError as exc:
        raise ConfigError(
            f"pack {where} was saved with model {ref!r}, which does not resolve here ({exc.what})",
            "pass --model (the same weights as the file the engine runs), or fetch the model",
        ) from None
    return ref


def check_manifest_shape(manifest: Mapping, where: str = "pack manifest") -> None:
    """Minimal schema check: required keys present with the right JSON types (see the schema file)."""
    from kvbridge.check.validate import require_fields

    require_fields(manifest, REQUIRED, where, fix=FIX)
    check_kind(manifest, PACK_KIND, SCHEMA_VERSION, where, "prefix pack", "pass a prefix pack folder")
    require_fields(manifest, NESTED_REQUIRED, where, fix=FIX)
    if manifest.get("kv_layout", PER_LAYER) not in KV_LAYOUTS:
        raise ArtifactError(
            f"{where} kv_layout {manifest['kv_layout']!r} is not one of {', '.join(KV_LAYOUTS)}",
            "upgrade kvbridge or re-create the pack with kvbridge pack save",
        )
    if not manifest["guide"]["token_ids"]:
        raise ArtifactError(f"{where} has no guide token ids", "re-create the pack")


@dataclass(frozen=True)
class Mismatch:
    field: str  # model, config, weights, tokenizer, guide_token_ids, dtype, rope, cache_format
    pack: Any
    model: Any
    forceable: bool

    def describe(self) -> str:
        def short(v: Any) -> str:
            s = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
            return s[:12] + "..." if isinstance(v, str) and len(v) == 64 else (s if len(s) <= 60 else s[:57] + "...")

        return f"{self.field} differs (pack {short(self.pack)} vs model {short(self.model)})"


def compare(
    manifest: Mapping,
    model,
    *,
    tokenizer_fp: dict | None = None,
    weights_fp: str | None = None,
    guide_ids_now: list | None = None,
    check_weights: bool = True,
    host=None,
) -> list[Mismatch]:
    """Every field in which the pack and ``model`` (+ tokenizer) disagree, most specific first."""
    spec = adapter_of(model, host).spec_of(model)
    out: list[Mismatch] = []
    m = manifest["model"]
    geometry = ("model_type", "num_layers", "num_kv_heads", "head_dim")
    for name, stored, now in (
        ("model", {k: m.get(k) for k in geometry}, {k: getattr(spec, k) for k in geometry}),
        ("rope", manifest["positional"], positional_config(spec)),
        ("cache_format", manifest["cache_format"], cache_format(spec)),
    ):
        if stored != now:  # the keys that differ, on each side
            keys = [k for k in sorted(set(stored) | set(now)) if stored.get(k) != now.get(k)]
            out.append(Mismatch(name, {k: stored.get(k) for k in keys}, {k: now.get(k) for k in keys}, False))
    forceable = [
        ("dtype", manifest["dtype"], spec.dtype),
        ("config", m["config_fingerprint"], model_config_fingerprint(model)),
    ]
    if check_weights:
        forceable.append(("weights", m["weights_fingerprint"], weights_fp or weights_fingerprint(model)))
    if tokenizer_fp is not None and tokenizer_fp.get("fingerprint"):
        forceable.append(("tokenizer", manifest["tokenizer"].get("fingerprint"), tokenizer_fp["fingerprint"]))
    out += [Mismatch(name, stored, now, True) for name, stored, now in forceable if stored != now]
    if guide_ids_now is not None and list(guide_ids_now) != list(manifest["guide"]["token_ids"]):
        out.append(
            Mismatch("guide_token_ids", f"{manifest['guide']['num_tokens']} ids", f"{len(guide_ids_now)} ids now", True)
        )
    return out


__all__ = [
    "SCHEMA_VERSION",
    "PACK_KIND",
    "TENSOR_FILE",
    "STACKED",
    "PER_LAYER",
    "KV_LAYOUTS",
    "FORCEABLE",
    "REQUIRED",
    "NESTED_REQUIRED",
    "Mismatch",
    "model_record",
    "build_manifest",
    "cache_format",
    "check_manifest_shape",
    "compare",
    "model_reference",
    "recorded_model",
    "positional_config",
    "tokenizer_fingerprint",
]
