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
the model; :func:`model_config_fingerprint` is the same for a loaded model, memoised on it like
:func:`weights_fingerprint`. :func:`model_id_revision` (id and hub revision of a model) and
:func:`tokenizer_identity` (the tokenizer fingerprint a pack records) complete what artifacts
store about a model. Torch is imported only by :func:`weights_fingerprint`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping

from kvbridge.check.axes import CONFIG_IGNORED  # config keys that do not change the model
from kvbridge.errors import KVBridgeError
from kvbridge.paths import cache_file as _home_file, cache_read, cache_write
from kvbridge.plugins import memo_on_model

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
CACHE_FILE = "file-hashes.json"
CACHE_LIMIT = 512
_LOCK = threading.Lock()


def config_fingerprint(config: Mapping) -> str:
    """sha256 of the config's canonical JSON, without fields that do not change the model."""
    data = {k: v for k, v in dict(config).items() if k not in CONFIG_IGNORED}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


_MEMO_ATTR = "_kvbridge_weights_fingerprint"


def model_config_fingerprint(model) -> str:
    """:func:`config_fingerprint` of ``model.config.to_dict()``, memoised on the model.

    Keyed (:func:`kvbridge.plugins.memo_on_model`) by the class of the config the model holds now and
    the ``repr`` of its attributes (nested configs print their full JSON; a dict or list changed in
    place prints differently): setting or replacing any config attribute or the whole config object
    re-computes; a cached answer costs one ``repr`` of the config's attributes instead of ``to_dict()``.
    """
    return memo_on_model(model, "_kvbridge_config_fingerprint", lambda: config_fingerprint(model.config.to_dict()))


def _tensor_slots(model) -> tuple:
    """``(module's _parameters or _buffers dict, name)`` of every tensor a model holds (walked once)."""
    return tuple(
        (getattr(mod, kind), name)
        for _, mod in model.named_modules()
        for kind in ("_parameters", "_buffers")
        for name, t in getattr(mod, kind).items()
        if t is not None
    )


def _weights_stamp(slots: tuple) -> list:
    """What identifies a model's tensors without reading them: per slot the tensor object, its
    data address and its version counter (bumped by in-place changes through autograd-visible ops,
    resizes included; a cast or a move gives new data). A slot emptied since is ``None``."""
    return [None if t is None else (id(t), t.data_ptr(), t._version) for t in [d.get(n) for d, n in slots]]


def weights_fingerprint(model) -> str:
    """sha256 over every parameter and buffer name, shape, dtype and bytes of a model in memory.

    Computed once per model and memoised on it, keyed by :func:`_weights_stamp` over the slots
    the model held then: replacing a parameter or buffer (object or storage), casting the model or
    changing a weight in place re-hashes; a cached answer reads no tensor byte (well under a
    millisecond for a 135M model). Writes through ``tensor.data`` bypass the version counter, and
    modules added later are not seen: call :func:`forget_weights_fingerprint` after either.
    """
    import torch

    memo = getattr(model, _MEMO_ATTR, None)
    if memo is not None and memo[1] == _weights_stamp(memo[0]):
        return memo[2]
    slots = _tensor_slots(model) if hasattr(model, "named_modules") else None
    h = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            t = tensor.detach().contiguous().cpu()
            h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    digest = h.hexdigest()
    if slots is not None:
        with contextlib.suppress(AttributeError, TypeError):  # a model that takes no attributes: no memo
            object.__setattr__(model, _MEMO_ATTR, (slots, _weights_stamp(slots), digest))
    return digest


def forget_weights_fingerprint(model) -> None:
    """Drop the memoised :func:`weights_fingerprint` of ``model`` (after writes through ``.data``)."""
    if getattr(model, _MEMO_ATTR, None) is not None:
        object.__delattr__(model, _MEMO_ATTR)


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
            return fp_identity(tokenizer_fp.fingerprint_dir(path))
        except KVBridgeError:
            return None

    got = from_dir(Path(folder)) if folder is not None else None
    if got is not None or tokenizer is None:
        return got or dict(_UNKNOWN)
    stamp = _tokenizer_stamp(tokenizer)  # memoised on the tokenizer while the stamp holds
    memo = getattr(tokenizer, _TOK_MEMO_ATTR, None)
    if memo is None or memo[0] != stamp:
        memo = (stamp, _object_identity(tokenizer, from_dir))
        with contextlib.suppress(AttributeError, TypeError):  # an object that takes no attributes: no memo
            object.__setattr__(tokenizer, _TOK_MEMO_ATTR, memo)
    return dict(memo[1])


def fp_identity(fp) -> dict | None:
    """The record of a :class:`~kvbridge.check.tokenizer_fp.TokenizerFingerprint` (None for None)."""
    if fp is None:
        return None
    return {"fingerprint": fp.digest, "kind": fp.kind, "vocab_size": fp.vocab_size, "source": "tokenizer_fp"}


_TOK_MEMO_ATTR = "_kvbridge_tokenizer_identity"
_UNKNOWN = {"fingerprint": None, "kind": "", "vocab_size": 0, "source": "none"}


def _tokenizer_stamp(tokenizer) -> tuple:
    """What changes when a tokenizer object is changed the ways people change one (added tokens,
    special tokens, chat template): the memo key of :func:`tokenizer_identity`."""
    return (
        type(tokenizer).__name__,
        len(tokenizer) if hasattr(tokenizer, "__len__") else None,
        repr(getattr(tokenizer, "special_tokens_map", None)),
        getattr(tokenizer, "chat_template", None),
        len(getattr(tokenizer, "added_tokens_decoder", None) or ()),
    )


def _object_identity(tokenizer, from_dir) -> dict:
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
        return {
            "fingerprint": hashlib.sha256(to_str().encode()).hexdigest(),
            "kind": "tokenizers-json",
            "vocab_size": int(len(tokenizer)) if hasattr(tokenizer, "__len__") else 0,
            "source": "backend-json",
        }
    return dict(_UNKNOWN)


# -- files ---------------------------------------------------------------------------------------------
def _cache_write(path: Path | None, key: str, digest: str) -> None:
    with _LOCK:
        cache_write(path, key, digest, limit=CACHE_LIMIT)


def _key(path: Path, st: os.stat_result) -> str:
    return f"{path}|{st.st_size}|{st.st_mtime_ns}"


def file_sha256(path: str | Path, *, cache: bool = True) -> str:
    """The sha256 of every byte of ``path`` (streamed), cached by path, size and mtime."""
    path = Path(path).resolve()
    cache_file = _home_file(CACHE_FILE) if cache else None
    key = _key(path, path.stat())
    hit = cache_read(cache_file).get(key)
    if isinstance(hit, str) and len(hit) == 64:
        return hit
    from kvbridge.artifacts import sha256_file

    digest = sha256_file(path)
    if _key(path, path.stat()) == key:  # unchanged while it was read: safe to remember
        _cache_write(cache_file, key, digest)
    return digest


def remember_sha256(path: str | Path, digest: str) -> None:
    """Record ``digest`` as the sha256 of ``path`` as it is now (a file just written and checked)."""
    path = Path(path).resolve()
    _cache_write(_home_file(CACHE_FILE), _key(path, path.stat()), digest)


def weight_files(folder: str | Path) -> list[Path]:
    """The weight files directly in ``folder``, sorted by name."""
    folder = Path(folder)
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES) if folder.is_dir() else []


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


def loaded_tokenizer_identity(loaded, tokenizer_path: str | Path | None = None, tokenizer: Any = None) -> dict:
    """The tokenizer fingerprint an artifact records for a :class:`~kvbridge.models.loading.LoadedModel`:
    of ``tokenizer_path`` (``tokenizer``: the tokenizer loaded from it) when given, else of the
    model's own tokenizer files (its loaded tokenizer when it has none)."""
    tok = tokenizer if tokenizer is not None else loaded.tokenizer
    if tokenizer_path:
        return tokenizer_identity(tok, folder=tokenizer_path if Path(tokenizer_path).is_dir() else None)
    fp = loaded.ref.tokenizer()
    return fp_identity(fp) if fp is not None else tokenizer_identity(tok)
