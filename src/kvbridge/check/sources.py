"""Model manifests and config -> ModelSpec, offline and without torch or transformers.

Reference resolution (paths, GGUF files, the Hugging Face cache, short names, ``zoo:`` and
plugin schemes) lives in :mod:`kvbridge.models.resolve`, above this module (which imports nothing
from :mod:`kvbridge.models`). This module holds what ``check`` and ``describe`` need besides: manifest records (``manifests/models/``, ``$KVBRIDGE_MANIFEST_PATH``,
folders plugins publish; ``kvbridge check Qwen/Qwen2.5-0.5B Qwen/Qwen2.5-1.5B`` answers on a
machine with no weights) and :func:`describe_config` / manifest geometry (JSON files are read by
:func:`kvbridge.check.validate.load_json`, one-line errors naming the file and field).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from kvbridge.check.validate import load_json
from kvbridge.errors import ConfigError, KVBridgeError, UnsupportedModelError, did_you_mean
from kvbridge.plugins import host_or_default

REPO_MANIFESTS = Path(__file__).resolve().parents[1] / "manifests" / "models"  # package data (works from a wheel)
MANIFEST_ENV = "KVBRIDGE_MANIFEST_PATH"
#: keys a manifest record may have (see manifests/README.md and the JSON schema)
MANIFEST_KEYS = {
    "id",
    "family",
    "source",
    "config",
    "geometry",
    "aliases",
    "tokenizer",
    "notes",
    "generation_config",
    "$schema",
}


# -- manifests ------------------------------------------------------------------------------------
def validate_manifest(record: Any, where: Path | str) -> dict:
    """Check a manifest record's shape (the schema's required parts); one-line errors."""
    if not isinstance(record, dict):
        raise ConfigError(
            f"{where}: a manifest record must be a JSON object, got {type(record).__name__}",
            "see manifests/README.md for the format",
        )
    for key, typ in (("id", str), ("family", str), ("config", dict)):
        if key not in record:
            raise ConfigError(f"{where}: manifest field {key!r} is missing", "see manifests/README.md")
        if not isinstance(record[key], typ):
            raise ConfigError(f"{where}: manifest field {key!r} must be a {typ.__name__}", "see manifests/README.md")
    if "model_type" not in record["config"]:
        raise ConfigError(
            f"{where}: manifest field 'config.model_type' is missing", "copy model_type from the model's config.json"
        )
    extra = sorted(set(record) - MANIFEST_KEYS)
    if extra:
        raise ConfigError(
            f"{where}: unknown manifest field {extra[0]!r}",
            f"{did_you_mean(extra[0], sorted(MANIFEST_KEYS), n=1, quote=True)}allowed: {', '.join(sorted(MANIFEST_KEYS - {'$schema'}))}",
        )
    aliases = record.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ConfigError(f"{where}: manifest field 'aliases' must be a list of strings", "see manifests/README.md")
    return record


def manifest_dirs(host=None) -> list[Path]:
    """Where manifest records are read from, in priority order (first match wins):
    ``$KVBRIDGE_MANIFEST_PATH``, then what ``kvbridge_manifest_dirs`` returns: kvbridge's own
    records first (:mod:`kvbridge.builtin.manifests`, ``tryfirst``), then plugins'."""
    env = [Path(p).expanduser() for p in os.environ.get(MANIFEST_ENV, "").split(os.pathsep) if p]
    return env + host_or_default(host).manifest_dirs()  # the host's one collection point: results type-checked there


def _read_manifest_file(path: Path) -> list[dict]:
    if path.suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})", "fix the manifest file") from None
    else:
        data = load_json(path, what="manifest file", object_only=False)
    if isinstance(data, dict) and "models" in data and "id" not in data:
        records = data["models"]
        if not isinstance(records, list):
            raise ConfigError(f"{path}: manifest field 'models' must be a list of records", "see manifests/README.md")
        return [validate_manifest(r, f"{path} (models[{i}])") for i, r in enumerate(records)]
    return [validate_manifest(data, path)]


def load_manifests(host=None, dirs: Iterable[Path] | None = None) -> dict[str, tuple[dict, Path]]:
    """All manifest records by id: ``{id: (record, file)}``; earlier folders win."""
    out: dict[str, tuple[dict, Path]] = {}
    for folder in manifest_dirs(host) if dirs is None else dirs:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix not in (".json", ".toml") or path.name.startswith("."):
                continue
            for record in _read_manifest_file(path):
                out.setdefault(record["id"], (record, path))
    return out


def manifest_index(manifests: Mapping[str, tuple[dict, Path]]) -> dict[str, str]:
    """lower-cased id / alias / bare name -> id (bare names only where unambiguous)."""
    index: dict[str, str] = {}
    bare: dict[str, list[str]] = {}
    for mid, (record, _) in manifests.items():
        index[mid.lower()] = mid
        for alias in record.get("aliases", []):
            index.setdefault(alias.lower(), mid)
        bare.setdefault(mid.split("/")[-1].lower(), []).append(mid)
    for name, ids in bare.items():
        if len(ids) == 1:
            index.setdefault(name, ids[0])
    return index


# -- describe with file-naming errors ----------------------------------------------------------------
#: the ModelSpec sizes :func:`validate_spec` checks -> the config keys each usually comes from (for error messages)
SPEC_FIELDS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim", "hidden_size", "n_embd"),
}


def validate_spec(spec, config: Mapping, where: str) -> None:
    """Refuse specs a cache cannot have (zero or negative sizes), naming the config field."""
    for name, keys in SPEC_FIELDS.items():
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            key = next((k for k in keys if k in config), keys[0])
            raise ConfigError(
                f"{where}: field {key!r} gives {name} = {value!r}; it must be a positive integer",
                f"fix {key!r} in the config",
            )


#: the largest value a real model's config gives each size field (beyond it a config is wrong, and building
#: per-layer tables or the model would run out of memory or time before saying so)
SIZE_LIMITS = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers"), 10_000),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_key_value_heads", "num_heads"), 16_384),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model"), 1 << 20),
    "head_dim": 1 << 16,
    **dict.fromkeys(("intermediate_size", "n_inner"), 1 << 24),
    **dict.fromkeys(("vocab_size", "max_position_embeddings", "n_positions"), 2**31 - 1),
    "num_experts": 1 << 16,
}


def check_size_fields(config: Mapping, where: str, _depth: int = 0) -> None:
    """Refuse a size field beyond :data:`SIZE_LIMITS` (also in ``text_config``), naming the field."""
    for key, limit in SIZE_LIMITS.items():
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            raise ConfigError(
                f"{where}: field {key!r} is {value}, beyond any real model (at most {limit})",
                f"fix {key!r} in the config",
            )
    text = config.get("text_config")
    if isinstance(text, Mapping) and _depth < 2:
        check_size_fields(text, f"{where} (text_config)", _depth + 1)


def describe_config(config: Mapping, *, where: str = "config", host=None):
    """ModelSpec of a config mapping through the plugin host; every error names ``where``."""
    host = host_or_default(host)
    if not isinstance(config.get("model_type"), str) or not config.get("model_type"):
        raise ConfigError(
            f"{where}: field 'model_type' is missing", "pass a Hugging Face config.json (every one has model_type)"
        )
    check_size_fields(config, where)
    try:
        try:
            adapter = host.adapter_for(dict(config))
        except UnsupportedModelError:
            text = config.get("text_config")  # multimodal wrappers: the text model holds the cache
            if not (isinstance(text, Mapping) and text.get("model_type")):
                raise
            config = dict(text)
            adapter = host.adapter_for(config)
        spec = adapter.describe(dict(config))
    except KVBridgeError as exc:
        msg = exc.what
        if "model type" in msg and "model_type" not in msg:
            msg = f"field 'model_type': {msg}"
        raise type(exc)(f"{where}: {msg}", exc.fix) from None
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        if os.environ.get("KVBRIDGE_DEBUG"):
            raise
        detail = (
            f"field {exc.args[0]!r} is missing"
            if isinstance(exc, KeyError) and exc.args
            else f"{type(exc).__name__}: {exc}"
        )
        raise ConfigError(
            f"{where}: {detail} (model_type {config.get('model_type')!r})",
            "compare the config with the model's published config.json",
        ) from None
    validate_spec(spec, config, where)
    return host.resolved(spec)


# -- manifest geometry ---------------------------------------------------------------------------------
def _rope_geometry(rope) -> dict:
    return {
        "type": rope.rope_type,
        "theta": float(rope.theta),
        "partial_factor": round(rope.partial_factor, 6),
        "interleaved": rope.interleaved,
        "scaling": rope.params,
    }


def spec_geometry(spec) -> dict:
    """The ``geometry`` block of a manifest record, computed from a ModelSpec.

    Keys: num_layers, num_attention_heads, num_kv_heads (as cached), head_dim, hidden_size,
    positional, rope (type, theta, partial_factor, interleaved, scaling; null without RoPE),
    sliding_window, attention (full | sliding | hybrid), full_attention_layers (hybrid only),
    rope_by_layer_type (only when layer types use different tables), nope_layers (only when some
    layers of a RoPE model use no positions), attention_chunk_size (only with chunked layers),
    qk_norm, vocab_size, max_position_embeddings, dtype.
    """
    kind = spec.attention_kind
    out = {
        k: getattr(spec, k)
        for k in "num_layers num_attention_heads num_kv_heads head_dim hidden_size positional".split()
    }
    out["rope"] = _rope_geometry(spec.rope) if spec.positional == "rope" and spec.rope is not None else None
    out["sliding_window"] = spec.sliding_window if kind != "full" else None
    out["attention"] = kind
    out.update({k: getattr(spec, k) for k in ("qk_norm", "vocab_size", "max_position_embeddings", "dtype")})
    if kind == "hybrid":
        out["full_attention_layers"] = [i for i, t in enumerate(spec.layer_types) if t == "full_attention"]
    if spec.rope_by_layer_type and spec.positional == "rope":
        out["rope_by_layer_type"] = {k: _rope_geometry(v) for k, v in spec.rope_by_layer_type}
    if spec.nope_layers and spec.positional == "rope":
        out["nope_layers"] = list(spec.nope_layers)
    if spec.attention_chunk_size:
        out["attention_chunk_size"] = spec.attention_chunk_size
    return out


def geometry_diff(expected: Mapping, actual: Mapping, prefix: str = "") -> list[str]:
    """Human-readable differences between two geometry blocks (floats compared to 1e-9 relative)."""
    out = []
    for key in sorted(set(expected) | set(actual)):
        a, b = expected.get(key, "<absent>"), actual.get(key, "<absent>")
        name = f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(geometry_diff(a, b, name + "."))
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
            if abs(float(a) - float(b)) > 1e-9 * max(1.0, abs(float(a))):
                out.append(f"{name}: manifest {a!r} != computed {b!r}")
        elif a != b:
            out.append(f"{name}: manifest {a!r} != computed {b!r}")
    return out
