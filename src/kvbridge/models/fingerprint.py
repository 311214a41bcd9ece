"""Model identity: the one place kvbridge hashes configs, weight files and in-memory weights.

Two kinds of weight fingerprint, both covering every byte (none ever concludes identity from
part of a file):

- :func:`weights_digest` (files on disk, used by ``check`` and the loading layer): the
  sha256 of each weight file (``.safetensors``, ``.bin``, ``.pt``, ``.pth``, ``.gguf``),
  streamed, combined with the file names and sizes. Per-file hashes are cached in
  ``$KVBRIDGE_HOME/file-hashes.json`` keyed by resolved path, size and mtime (nanoseconds),
  so a second ``check`` of a multi-GB folder costs a ``stat`` per file; a changed file (new
  size or mtime) is hashed again. ``KVBRIDGE_NO_CACHE=1`` turns the cache off.
- :func:`weights_fingerprint` (a model in memory, used by packs and mapping artifacts): the
  sha256 over every parameter and buffer name, shape, dtype and bytes.

:func:`config_fingerprint` hashes a config's canonical JSON without fields that do not change
the model. :func:`model_id_revision` (id and hub revision of a model) and
:func:`tokenizer_identity` (the tokenizer fingerprint a pack records) complete what artifacts
store about a model. Torch is imported only by :func:`weights_fingerprint`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping

from kvbridge.errors import KVBridgeError
from kvbridge.models.paths import cache_file as _home_file, cache_read, cache_write

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
CACHE_FILE = "file-hashes.json"
CACHE_LIMIT = 512
_BLOCK = 1 << 22
_LOCK = threading.Lock()

#: config keys that do not change what the model computes
CONFIG_IGNORED = frozenset({"_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures",
                            "_attn_implementation", "_attn_implementation_autoset", "use_cache", "_commit_hash",
                            "output_attentions", "output_hidden_states", "return_dict"})


def config_fingerprint(config: Mapping) -> str:
    """sha256 of the config's canonical JSON, without fields that do not change the model."""
    data = {k: v for k, v in dict(config).items() if k not in CONFIG_IGNORED}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def weights_fingerprint(model) -> str:
    """sha256 over every parameter and buffer name, shape, dtype and bytes of a model in memory."""
    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            t = tensor.detach().contiguous().cpu()
            h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# -- model id and tokenizer (packs) ---------------------------------------------------------------
def model_id_revision(model, model_dir: str | Path | None = None) -> dict:
    """``{"id", "revision"}`` of a model: the folder or hub id, the hub snapshot hash when known."""
    cfg = model.config
    name = str(getattr(cfg, "_name_or_path", "") or getattr(model, "name_or_path", "") or "")
    revision = getattr(cfg, "_commit_hash", None)
    folder = Path(model_dir) if model_dir else (Path(name) if name and Path(name).exists() else None)
    if folder is not None:
        folder = folder.resolve()
        model_id = folder.name
        if revision is None and folder.parent.name == "snapshots" and len(folder.name) == 40:
            revision = folder.name  # hub cache layout: models--org--name/snapshots/<commit>
            model_id = folder.parent.parent.name.removeprefix("models--").replace("--", "/")
    else:
        model_id = name or str(getattr(cfg, "model_type", "model"))
    return {"id": model_id, "revision": revision}


def tokenizer_identity(tokenizer: Any = None, *, folder: str | Path | None = None) -> dict:
    """``{"fingerprint", "kind", "vocab_size", "source"}`` of a tokenizer folder or object.

    Uses :mod:`kvbridge.check.tokenizer_fp` on the folder's files (a tokenizer object is saved to a
    temporary folder first); falls back to sha256 of the backend's JSON serialisation.
    """
    from kvbridge.check import tokenizer_fp

    def from_dir(path: Path) -> dict | None:
        try:
            fp = tokenizer_fp.fingerprint_dir(path)
        except KVBridgeError:
            return None
        if fp is None:
            return None
        return {"fingerprint": fp.digest, "kind": fp.kind, "vocab_size": fp.vocab_size, "source": "tokenizer_fp"}

    if folder is not None:
        got = from_dir(Path(folder))
        if got is not None:
            return got
    if tokenizer is None:
        return {"fingerprint": None, "kind": "", "vocab_size": 0, "source": "none"}
    if hasattr(tokenizer, "save_pretrained"):
        with tempfile.TemporaryDirectory(prefix="kvbridge-tok-") as tmp:
            try:
                tokenizer.save_pretrained(tmp)
                got = from_dir(Path(tmp))
            except Exception:  # noqa: BLE001 - fall back to the backend JSON below
                got = None
        if got is not None:
            return got
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    to_str = getattr(backend, "to_str", None)
    if callable(to_str):
        return {"fingerprint": hashlib.sha256(to_str().encode()).hexdigest(), "kind": "tokenizers-json",
                "vocab_size": int(len(tokenizer)) if hasattr(tokenizer, "__len__") else 0, "source": "backend-json"}
    return {"fingerprint": None, "kind": "", "vocab_size": 0, "source": "none"}


# -- files ---------------------------------------------------------------------------------------------
def _cache_path() -> Path | None:
    return _home_file(CACHE_FILE)


def _cache_write(path: Path | None, key: str, digest: str) -> None:
    with _LOCK:
        cache_write(path, key, digest, limit=CACHE_LIMIT)


def _key(path: Path, st: os.stat_result) -> str:
    return f"{path}|{st.st_size}|{st.st_mtime_ns}"


def file_sha256(path: str | Path, *, cache: bool = True) -> str:
    """The sha256 of every byte of ``path`` (streamed), cached by path, size and mtime."""
    path = Path(path).resolve()
    st = path.stat()
    cache_file = _cache_path() if cache else None
    key = _key(path, st)
    hit = cache_read(cache_file).get(key)
    if isinstance(hit, str) and len(hit) == 64:
        return hit
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    digest = h.hexdigest()
    if _key(path, path.stat()) == key:  # unchanged while it was read: safe to remember
        _cache_write(cache_file, key, digest)
    return digest


def weight_files(folder: str | Path) -> list[Path]:
    """The weight files directly in ``folder``, sorted by name."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def files_digest(files: Iterable[str | Path], *, cache: bool = True) -> str | None:
    """One sha256 over the names, sizes and full sha256 of ``files`` (None when there are none)."""
    files = sorted((Path(p) for p in files), key=lambda p: p.name)
    if not files:
        return None
    h = hashlib.sha256(b"kvbridge-weights-v2")
    for p in files:
        h.update(f"{p.name}|{p.stat().st_size}|{file_sha256(p, cache=cache)}\n".encode())
    return h.hexdigest()


def weights_digest(folder: str | Path, *, cache: bool = True) -> str | None:
    """The full-content fingerprint of the weight files in ``folder`` (None when there are none)."""
    return files_digest(weight_files(folder), cache=cache)


def describe_fingerprint(fp: Mapping[str, Any]) -> str:
    """A short line for messages: ``weights sha256:abcd1234... (Q4_1)``."""
    w = fp.get("weights")
    quant = f" ({fp['quantization']})" if fp.get("quantization") else ""
    return f"weights sha256:{w[:12]}{quant}" if w else "weights unknown"


__all__ = ["config_fingerprint", "weights_fingerprint", "model_id_revision", "tokenizer_identity", "file_sha256", "files_digest", "weights_digest",
           "weight_files", "describe_fingerprint", "WEIGHT_SUFFIXES"]
