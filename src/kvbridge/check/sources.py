"""Resolve a model reference to its config, offline and without torch or transformers.

A reference (what a user types after ``kvbridge check`` or ``describe``) is, in this order:

1. a local path: a model folder (a ``save_pretrained`` directory with ``config.json``, whose
   tokenizer files are picked up too), a ``config.json`` file, or a manifest record file;
2. a hub id (``org/name``, optionally ``@revision``) already in the local Hugging Face cache
   (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``). Nothing is
   ever downloaded;
3. the id or an alias of a record in a model manifest (``manifests/models/`` of this repo,
   folders in ``$KVBRIDGE_MANIFEST_PATH``, and folders plugins publish), so
   ``kvbridge check Qwen/Qwen2.5-0.5B Qwen/Qwen2.5-1.5B`` answers on a machine with no weights.

Anything else is a one-line :class:`~kvbridge.errors.ConfigError` naming the file and field
(or, for an unknown name, suggesting close manifest names).
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from kvbridge.errors import ConfigError, KVBridgeError, UnsupportedModelError
from kvbridge.check.tokenizer_fp import TokenizerFingerprint, find_tokenizer_files, fingerprint_files

REPO_MANIFESTS = Path(__file__).resolve().parents[1] / "manifests" / "models"  # package data (works from a wheel)
MANIFEST_ENV = "KVBRIDGE_MANIFEST_PATH"
#: keys a manifest record may have (see manifests/README.md and the JSON schema)
MANIFEST_KEYS = {"id", "family", "source", "config", "geometry", "aliases", "tokenizer", "notes",
                 "generation_config", "$schema"}
KINDS = ("dir", "config", "hf-cache", "manifest")


@dataclass(frozen=True)
class ResolvedModel:
    """A model reference resolved to a config mapping (and, where known, its tokenizer)."""

    ref: str  # what the user passed
    kind: str  # one of KINDS
    name: str  # display name: manifest id, hub id, or folder name
    config: dict = field(hash=False)  # the parsed config.json (or the manifest's "config")
    path: str  # the file the config came from (config.json or the manifest record)
    folder: str | None = None  # the folder holding config and tokenizer files, if any
    tokenizer_files: tuple = ()  # tokenizer files found beside the config
    tokenizer_record: dict | None = field(default=None, hash=False)  # a manifest's fingerprint
    generation_config: dict | None = field(default=None, hash=False)  # generation_config.json
    manifest: dict | None = field(default=None, hash=False)  # the whole manifest record

    def weights_digest(self) -> str | None:
        """A fingerprint of the weight files beside the config, or ``None`` when there are none.

        Files up to 512 MiB in all are hashed whole (sha256); larger checkpoints are fingerprinted
        from each file's name, size and first and last 4 MiB (which hold the safetensors header
        and tensor bytes), so `check` stays fast on multi-GB folders.
        """
        return weights_digest(Path(self.folder)) if self.folder else None

    def tokenizer(self) -> TokenizerFingerprint | None:
        """The tokenizer fingerprint, or ``None`` when no tokenizer files/record are known."""
        if self.tokenizer_files:
            return fingerprint_files([Path(p) for p in self.tokenizer_files])
        if self.tokenizer_record:
            try:
                return TokenizerFingerprint.from_dict(self.tokenizer_record)
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"{self.path}: field 'tokenizer' is not a valid fingerprint ({exc})",
                                  "recompute it with kvbridge.check.tokenizer_fp.fingerprint_dir") from None
        return None

    def spec(self, host=None):
        """The :class:`~kvbridge.check.spec.ModelSpec` of this model; errors name :attr:`path`."""
        return describe_config(self.config, where=self.path, host=host)

    def to_dict(self) -> dict:
        return {"ref": self.ref, "kind": self.kind, "name": self.name, "path": self.path,
                "folder": self.folder, "tokenizer_files": list(self.tokenizer_files)}


# -- config files --------------------------------------------------------------------------------
def read_json_object(path: Path, what: str = "config") -> dict:
    """A JSON object from ``path``, or a one-line ConfigError naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (expected a JSON {what})",
                          f"pass the model's {what} JSON file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})",
                          "check the path and its permissions") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})",
                          f"fix the file or pass the model's published {what}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}",
                          f"pass a {what} file (a JSON object of fields)")
    return data


def _from_folder(ref: str, folder: Path, kind: str, name: str) -> ResolvedModel:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        present = sorted(p.name for p in folder.iterdir())[:6] if folder.is_dir() else []
        listing = f" (it has: {', '.join(present)})" if present else " (it is empty)"
        raise ConfigError(f"{folder}: directory has no config.json{listing}",
                          "pass a save_pretrained folder, a config.json path, or a manifest model name")
    config = read_json_object(cfg_path)
    gen_path = folder / "generation_config.json"
    gen = None
    if gen_path.is_file():
        try:
            gen = read_json_object(gen_path, "generation config")
        except ConfigError:
            gen = None  # a broken generation config does not stop a check; it is only a hint
    tok = tuple(str(p) for p in find_tokenizer_files(folder))
    return ResolvedModel(ref=ref, kind=kind, name=name, config=config, path=str(cfg_path),
                         folder=str(folder), tokenizer_files=tok, generation_config=gen)


def _from_file(ref: str, path: Path) -> ResolvedModel:
    data = read_json_object(path)
    if "model_type" not in data and isinstance(data.get("config"), dict) and "id" in data:
        record = validate_manifest(data, path)
        return _from_manifest(ref, record, path)
    folder = path.parent
    tok = tuple(str(p) for p in find_tokenizer_files(folder)) if path.name == "config.json" else ()
    gen = None
    if (folder / "generation_config.json").is_file() and path.name == "config.json":
        try:
            gen = read_json_object(folder / "generation_config.json", "generation config")
        except ConfigError:
            gen = None
    name = folder.name if path.name == "config.json" else path.stem
    return ResolvedModel(ref=ref, kind="config", name=name, config=data, path=str(path),
                         folder=str(folder), tokenizer_files=tok, generation_config=gen)


# -- Hugging Face cache (offline) -----------------------------------------------------------------
def hf_cache_dir() -> Path:
    """The hub cache folder huggingface_hub would use (never created, never downloaded into)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def _looks_like_hub_id(ref: str) -> bool:
    parts = ref.split("/")
    return 1 <= len(parts) <= 2 and all(parts) and not ref.startswith((".", "~"))


def find_in_hf_cache(repo_id: str, revision: str | None = None) -> Path | None:
    """The snapshot folder of ``repo_id`` in the local cache that has a config.json, or None."""
    repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    wanted = revision or "main"
    ref_file = repo / "refs" / wanted
    if ref_file.is_file():
        commit = ref_file.read_text(encoding="utf-8").strip()
        snap = snapshots / commit
        if (snap / "config.json").is_file():
            return snap
    candidates = [s for s in snapshots.iterdir() if (s / "config.json").is_file()]
    if revision:
        candidates = [s for s in candidates if s.name.startswith(revision)]
    if not candidates:
        return None
    return max(candidates, key=lambda s: (s / "config.json").stat().st_mtime)


def cached_hub_ids() -> list[str]:
    """Hub ids of the models in the local cache (for suggestions)."""
    root = hf_cache_dir()
    if not root.is_dir():
        return []
    out = []
    for entry in root.iterdir():
        if entry.name.startswith("models--"):
            out.append(entry.name[len("models--"):].replace("--", "/", 1))
    return sorted(out)


# -- manifests ------------------------------------------------------------------------------------
def validate_manifest(record: Any, where: Path | str) -> dict:
    """Check a manifest record's shape (the schema's required parts); one-line errors."""
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: a manifest record must be a JSON object, got {type(record).__name__}",
                          "see manifests/README.md for the format")
    for key, typ in (("id", str), ("family", str), ("config", dict)):
        if key not in record:
            raise ConfigError(f"{where}: manifest field {key!r} is missing", "see manifests/README.md")
        if not isinstance(record[key], typ):
            raise ConfigError(f"{where}: manifest field {key!r} must be a {typ.__name__}",
                              "see manifests/README.md")
    if "model_type" not in record["config"]:
        raise ConfigError(f"{where}: manifest field 'config.model_type' is missing",
                          "copy model_type from the model's config.json")
    extra = sorted(set(record) - MANIFEST_KEYS)
    if extra:
        close = difflib.get_close_matches(extra[0], sorted(MANIFEST_KEYS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{where}: unknown manifest field {extra[0]!r}",
                          f"{hint}allowed: {', '.join(sorted(MANIFEST_KEYS - {'$schema'}))}")
    aliases = record.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ConfigError(f"{where}: manifest field 'aliases' must be a list of strings",
                          "see manifests/README.md")
    return record


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
FULL_HASH_LIMIT = 512 << 20
EDGE = 4 << 20


def weights_digest(folder: Path) -> str | None:
    """See :meth:`ResolvedModel.weights_digest`."""
    import hashlib

    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES) \
        if folder.is_dir() else []
    if not files:
        return None
    whole = sum(p.stat().st_size for p in files) <= FULL_HASH_LIMIT
    h = hashlib.sha256(b"full" if whole else b"edges")
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.name}|{size}|".encode())
        with open(p, "rb") as fh:
            if whole or size <= 2 * EDGE:
                while block := fh.read(1 << 22):
                    h.update(block)
            else:
                h.update(fh.read(EDGE))
                fh.seek(size - EDGE)
                h.update(fh.read(EDGE))
    return h.hexdigest()


def _plugin_manifest_dirs(host) -> list[Path]:
    """Folders that plugins publish through ``kvbridge_manifest_dirs`` (when the hook exists)."""
    hook = getattr(host.pm.hook, "kvbridge_manifest_dirs", None) if host is not None else None
    if hook is None:
        return []
    out: list[Path] = []
    try:
        results = hook()
    except Exception:  # a broken plugin must not break resolution of other models
        return []
    for item in results or []:
        items = item if isinstance(item, (list, tuple)) else [item]
        out.extend(Path(p) for p in items if p)
    return out


def manifest_dirs(host=None) -> list[Path]:
    """Where manifest records are read from, in priority order (first match wins)."""
    dirs = [Path(p).expanduser() for p in os.environ.get(MANIFEST_ENV, "").split(os.pathsep) if p]
    if REPO_MANIFESTS.is_dir():
        dirs.append(REPO_MANIFESTS)
    dirs.extend(_plugin_manifest_dirs(host))
    return dirs


def _read_manifest_file(path: Path) -> list[dict]:
    if path.suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})", "fix the manifest file") from None
    else:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})",
                              "fix the manifest file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot be read ({exc})", "fix the manifest file") from None
    if isinstance(data, dict) and "models" in data and "id" not in data:
        records = data["models"]
        if not isinstance(records, list):
            raise ConfigError(f"{path}: manifest field 'models' must be a list of records",
                              "see manifests/README.md")
        return [validate_manifest(r, f"{path} (models[{i}])") for i, r in enumerate(records)]
    return [validate_manifest(data, path)]


def load_manifests(host=None, dirs: Iterable[Path] | None = None) -> dict[str, tuple[dict, Path]]:
    """All manifest records by id: ``{id: (record, file)}``; earlier folders win."""
    out: dict[str, tuple[dict, Path]] = {}
    for folder in (manifest_dirs(host) if dirs is None else dirs):
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix not in (".json", ".toml") or path.name.startswith("."):
                continue
            for record in _read_manifest_file(path):
                out.setdefault(record["id"], (record, path))
    return out


def _manifest_index(manifests: Mapping[str, tuple[dict, Path]]) -> dict[str, str]:
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


def _from_manifest(ref: str, record: dict, path: Path) -> ResolvedModel:
    return ResolvedModel(ref=ref, kind="manifest", name=record["id"], config=dict(record["config"]),
                         path=str(path), folder=None, tokenizer_files=(),
                         tokenizer_record=record.get("tokenizer"),
                         generation_config=record.get("generation_config"), manifest=record)


# -- resolution ------------------------------------------------------------------------------------
def resolve(ref: str, *, host=None, manifests: Mapping | None = None) -> ResolvedModel:
    """Resolve ``ref`` (path, cached hub id, or manifest name) to a :class:`ResolvedModel`."""
    ref = str(ref).strip()
    if not ref:
        raise ConfigError("empty model reference", "pass a model folder, a config.json, or a model name")
    path = Path(ref).expanduser()
    if path.is_dir():
        return _from_folder(ref, path, "dir", path.resolve().name)
    if path.is_file():
        return _from_file(ref, path)
    if path.exists():
        raise ConfigError(f"{path}: not a file or folder", "pass a model folder or a config.json path")
    if ref.startswith((".", "/", "~")) or ref.endswith((".json", ".toml")):
        raise ConfigError(f"{path}: no such file or directory",
                          "check the path (hub ids are written org/name, without a leading ./)")

    repo_id, _, revision = ref.partition("@")
    if _looks_like_hub_id(repo_id):
        snap = find_in_hf_cache(repo_id, revision or None)
        if snap is not None:
            return _from_folder(ref, snap, "hf-cache", repo_id)

    manifests = load_manifests(host) if manifests is None else manifests
    index = _manifest_index(manifests)
    mid = index.get(repo_id.lower())
    if mid is not None:
        record, mpath = manifests[mid]
        return _from_manifest(ref, record, mpath)

    names = sorted(set(manifests) | set(cached_hub_ids()))
    lowered = {n.lower(): n for n in names}
    lowered.update({n.split("/")[-1].lower(): n for n in names})
    close = difflib.get_close_matches(repo_id.lower(), list(lowered), n=3, cutoff=0.6)
    suggestions = list(dict.fromkeys(lowered[c] for c in close))
    hint = f"did you mean {', '.join(suggestions)}? " if suggestions else ""
    raise ConfigError(
        f"unknown model {ref!r}: not a local path, not in the Hugging Face cache ({hf_cache_dir()}),"
        " not in a manifest",
        f"{hint}pass a model folder or config.json, or a name from `kvbridge describe --list`")


# -- describe with file-naming errors ----------------------------------------------------------------
#: ModelSpec field -> the config keys it usually comes from (for error messages)
SPEC_FIELDS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim", "hidden_size", "n_embd"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
}


def _config_key(config: Mapping, spec_field: str) -> str:
    for key in SPEC_FIELDS.get(spec_field, ()):
        if key in config:
            return key
    return SPEC_FIELDS.get(spec_field, (spec_field,))[0]


def validate_spec(spec, config: Mapping, where: str) -> None:
    """Refuse specs a cache cannot have (zero or negative sizes), naming the config field."""
    for name in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim"):
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            key = _config_key(config, name)
            raise ConfigError(f"{where}: field {key!r} gives {name} = {value!r}; it must be a positive integer",
                              f"fix {key!r} in the config")


def describe_config(config: Mapping, *, where: str = "config", host=None):
    """ModelSpec of a config mapping through the plugin host; every error names ``where``."""
    if host is None:
        from kvbridge.plugins import get_host

        host = get_host()
    if not isinstance(config.get("model_type"), str) or not config.get("model_type"):
        raise ConfigError(f"{where}: field 'model_type' is missing",
                          "pass a Hugging Face config.json (every one has model_type)")
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
        detail = f"field {exc.args[0]!r} is missing" if isinstance(exc, KeyError) and exc.args else \
            f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"{where}: {detail} (model_type {config.get('model_type')!r})",
                          "compare the config with the model's published config.json") from None
    validate_spec(spec, config, where)
    return spec


__all__ = ["ResolvedModel", "resolve", "describe_config", "load_manifests", "manifest_dirs", "spec_geometry", "geometry_diff",
           "validate_manifest", "hf_cache_dir", "find_in_hf_cache", "read_json_object", "validate_spec"]


# -- manifest geometry ---------------------------------------------------------------------------------
def _rope_geometry(rope) -> dict:
    return {"type": rope.rope_type, "theta": float(rope.theta), "partial_factor": round(rope.partial_factor, 6),
            "interleaved": rope.interleaved, "scaling": rope.params}


def spec_geometry(spec) -> dict:
    """The ``geometry`` block of a manifest record, computed from a ModelSpec.

    Keys: num_layers, num_attention_heads, num_kv_heads (as cached), head_dim, hidden_size,
    positional, rope (type, theta, partial_factor, interleaved, scaling; null without RoPE),
    sliding_window, attention (full | sliding | hybrid), full_attention_layers (hybrid only),
    rope_by_layer_type (only when layer types use different tables), qk_norm, vocab_size,
    max_position_embeddings, dtype.
    """
    kind = spec.attention_kind
    out = {
        "num_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_size": spec.hidden_size,
        "positional": spec.positional,
        "rope": _rope_geometry(spec.rope) if spec.positional == "rope" and spec.rope is not None else None,
        "sliding_window": spec.sliding_window if kind != "full" else None,
        "attention": kind,
        "qk_norm": spec.qk_norm,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "dtype": spec.dtype,
    }
    if kind == "hybrid":
        out["full_attention_layers"] = [i for i, t in enumerate(spec.layer_types) if t == "full_attention"]
    if spec.rope_by_layer_type and spec.positional == "rope":
        out["rope_by_layer_type"] = {k: _rope_geometry(v) for k, v in spec.rope_by_layer_type}
    return out


def geometry_diff(expected: Mapping, actual: Mapping, prefix: str = "") -> list[str]:
    """Human-readable differences between two geometry blocks (floats compared to 1e-9 relative)."""
    out = []
    for key in sorted(set(expected) | set(actual)):
        a, b = expected.get(key, "<absent>"), actual.get(key, "<absent>")
        name = f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(geometry_diff(a, b, name + "."))
        elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
                and not isinstance(b, bool):
            if abs(float(a) - float(b)) > 1e-9 * max(1.0, abs(float(a))):
                out.append(f"{name}: manifest {a!r} != computed {b!r}")
        elif a != b:
            out.append(f"{name}: manifest {a!r} != computed {b!r}")
    return out
