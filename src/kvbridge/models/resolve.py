"""Resolve a model reference to a :class:`~kvbridge.models.ref.ModelRef`, offline, without torch.

A reference is, in this order:

1. ``SCHEME:REST`` for a registered scheme: ``zoo:NAME`` (the embedded tiny zoo) or a scheme a
   plugin registers through ``kvbridge_register_model_sources``;
2. a known short name (``smollm2``, ``qwen2.5-coder-0.5b``/``-1.5b``; ``kvbridge models``), read from
   ``$KVBRIDGE_HOME/models`` once fetched;
3. a local path: a model folder (``config.json`` + weights + tokenizer files), a folder holding
   one ``.gguf`` file, a ``.gguf`` file, a ``config.json`` file, or a manifest record file;
4. a hub id (``org/name``, optionally ``@revision``) already in the local Hugging Face cache
   (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``); nothing is
   ever downloaded;
5. the id or an alias of a manifest record (``manifests/models``, ``$KVBRIDGE_MANIFEST_PATH``,
   folders plugins publish): a config with no weights, enough for ``describe`` and ``check``.

Anything else is a one-line :class:`~kvbridge.errors.ConfigError` suggesting close names.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Mapping

from kvbridge.check.validate import load_json
from kvbridge.errors import ConfigError, did_you_mean
from kvbridge.models.ref import ModelRef


# -- local files -----------------------------------------------------------------------------------
def _generation(folder: Path) -> dict | None:
    path = folder / "generation_config.json"
    if not path.is_file():
        return None
    try:
        return load_json(path, what="generation config")
    except ConfigError:
        return None  # a broken generation config does not stop a check; it is only a hint


def from_gguf(ref: str, path: Path, *, name: str | None = None, kind: str = "gguf", source: str = "") -> ModelRef:
    """A ModelRef of a ``.gguf`` file: geometry from its header (no tensor is read)."""
    from kvbridge.models.gguf import read_gguf, to_hf_config

    info = read_gguf(path)
    return ModelRef(
        ref=ref,
        kind=kind,
        name=name or path.stem,
        config=to_hf_config(info),
        path=str(path),
        folder=str(path.parent),
        gguf_file=str(path),
        gguf=info,
        source=source,
    )


def from_folder(ref: str, folder: Path, kind: str = "dir", name: str | None = None, source: str = "") -> ModelRef:
    """A ModelRef of a ``save_pretrained`` folder, or of a folder holding one ``.gguf``."""
    name = name or folder.resolve().name
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        from kvbridge.models.gguf import find_gguf

        if folder.is_dir():
            gguf = find_gguf(folder)
            if gguf is not None:
                return from_gguf(
                    ref,
                    gguf,
                    name=name if kind != "dir" else None,
                    kind="gguf" if kind == "dir" else kind,
                    source=source,
                )
        present = sorted(p.name for p in folder.iterdir())[:6] if folder.is_dir() else []
        listing = f" (it has: {', '.join(present)})" if present else " (it is empty)"
        raise ConfigError(
            f"{folder}: directory has no config.json or .gguf file{listing}",
            "pass a save_pretrained folder, a .gguf file, a config.json path, or a model name",
        )
    return _config_ref(ref, kind, name, load_json(cfg_path, what="config"), cfg_path, source, beside=True)


def _config_ref(ref: str, kind: str, name: str, config: dict, path: Path, source: str, beside: bool) -> ModelRef:
    """A ModelRef of the config at ``path``; ``beside``: with the tokenizer files and generation config
    of its folder."""
    from kvbridge.check.tokenizer_fp import find_tokenizer_files

    folder = path.parent
    tok = tuple(str(p) for p in find_tokenizer_files(folder)) if beside else ()
    generation = _generation(folder) if beside else None
    return ModelRef(ref, kind, name, config, str(path), str(folder), tok, generation_config=generation, source=source)


def from_file(ref: str, path: Path, source: str = "") -> ModelRef:
    from kvbridge.check.sources import validate_manifest

    if path.suffix == ".gguf":
        return from_gguf(ref, path, source=source)
    with open(path, "rb") as fh:
        if fh.read(4) == b"GGUF":
            return from_gguf(ref, path, source=source)
    data = load_json(path, what="config")
    if "model_type" not in data and isinstance(data.get("config"), dict) and "id" in data:
        return from_manifest(ref, validate_manifest(data, path), path)
    is_cfg = path.name == "config.json"
    return _config_ref(ref, "config", path.parent.name if is_cfg else path.stem, data, path, source, beside=is_cfg)


def from_manifest(ref: str, record: dict, path: Path) -> ModelRef:
    return ModelRef(
        ref=ref,
        kind="manifest",
        name=record["id"],
        config=dict(record["config"]),
        path=str(path),
        tokenizer_record=record.get("tokenizer"),
        generation_config=record.get("generation_config"),
        manifest=record,
    )


def from_path(ref: str, path: Path, *, kind: str = "dir", name: str | None = None, source: str = "") -> ModelRef:
    path = path.expanduser()
    if path.is_dir():
        return from_folder(ref, path, kind, name, source)
    if path.is_file():
        got = from_file(ref, path, source)
        return got if not name else replace(got, name=name, kind=kind if kind != "dir" else got.kind)
    if path.exists():
        raise ConfigError(f"{path}: not a file or folder", "pass a model folder, a .gguf or a config.json path")
    raise ConfigError(
        f"{path}: no such file or directory (the path does not exist)",
        "check the path (hub ids are written org/name, without a leading ./)",
    )


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


def find_in_hf_cache(repo_id: str, revision: str | None = None) -> Path | None:
    """The snapshot folder of ``repo_id`` in the local cache that has a config.json, or None."""
    repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref_file = repo / "refs" / (revision or "main")
    if ref_file.is_file():
        snap = snapshots / ref_file.read_text(encoding="utf-8").strip()
        if (snap / "config.json").is_file():
            return snap
    candidates = [s for s in snapshots.iterdir() if (s / "config.json").is_file()]
    if revision:
        candidates = [s for s in candidates if s.name.startswith(revision)]
    return max(candidates, key=lambda s: (s / "config.json").stat().st_mtime, default=None)


def cached_hub_ids() -> list[str]:
    """Hub ids of the models in the local cache (for suggestions)."""
    root = hf_cache_dir()
    if not root.is_dir():
        return []
    return sorted(
        e.name[len("models--") :].replace("--", "/", 1) for e in root.iterdir() if e.name.startswith("models--")
    )


# -- resolution ------------------------------------------------------------------------------------
def resolve(ref, *, host=None, manifests: Mapping | None = None) -> ModelRef:
    """Resolve ``ref`` (see the module docstring) to a :class:`ModelRef`; a ModelRef is returned as is."""
    if isinstance(ref, ModelRef):
        return ref
    from kvbridge.models import known as known_mod
    from kvbridge.models.schemes import schemes, split_scheme

    ref = str(ref).strip()
    if not ref:
        raise ConfigError("empty model reference", "pass a model folder, a .gguf file, a config.json, or a model name")
    if ":" in ref and not Path(ref).expanduser().exists():
        found = split_scheme(ref, schemes(host))
        if found is not None:
            scheme, rest = found
            try:
                out = scheme.resolver(rest)
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - a plugin resolver's failure is named, never a traceback
                raise ConfigError(
                    f"model source {scheme.name!r} ({scheme.plugin}) failed on {rest!r}: {type(exc).__name__}: {exc}",
                    "check the reference or the plugin",
                ) from None
            if isinstance(out, ModelRef):
                return out
            kind = "zoo" if scheme.name == "zoo" else "plugin"
            return from_path(ref, Path(out), kind=kind, name=ref, source=scheme.name)
    path = Path(ref).expanduser()
    model = known_mod.known(ref)
    if model is not None and not path.exists():
        return from_path(ref, known_mod.require_cached(model), kind="known", name=model.name, source=model.name)
    if path.exists() or ref.startswith((".", "/", "~")) or ref.endswith((".json", ".toml", ".gguf")):
        return from_path(ref, path)

    repo_id, _, revision = ref.partition("@")
    parts = repo_id.split("/")
    if 1 <= len(parts) <= 2 and all(parts) and not repo_id.startswith((".", "~")):  # a hub id (org/name)
        snap = find_in_hf_cache(repo_id, revision or None)
        if snap is not None:
            return from_folder(ref, snap, "hf-cache", repo_id)

    from kvbridge.check.sources import manifest_index, load_manifests

    manifests = load_manifests(host) if manifests is None else manifests
    mid = manifest_index(manifests).get(repo_id.lower())
    if mid is not None:
        return from_manifest(ref, *manifests[mid])  # (record, its file)
    raise _unknown(ref, repo_id, manifests, host)


def _unknown(ref: str, repo_id: str, manifests: Mapping, host) -> ConfigError:
    from kvbridge.models.known import KNOWN
    from kvbridge.models.schemes import schemes

    names = sorted(set(manifests) | set(cached_hub_ids()) | set(KNOWN))
    lowered = {n.lower(): n for n in names}
    lowered.update({n.split("/")[-1].lower(): n for n in names})
    hint = did_you_mean(repo_id.lower(), lowered, shown=lowered)
    scheme_names = ", ".join(f"{s}:" for s in schemes(host))
    return ConfigError(
        f"unknown model {ref!r}: not a local path, not a short name, not in the Hugging Face cache "
        f"({hf_cache_dir()}), not in a manifest",
        f"{hint}pass a model folder, a .gguf file or config.json, a scheme ({scheme_names}), or a name from "
        "`kvbridge models` / `kvbridge describe --list`",
    )
