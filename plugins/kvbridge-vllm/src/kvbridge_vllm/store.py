"""The vLLM prefix store: one safetensors file per stored prefix, and what it is checked against.

An entry ``STORE/<id>.safetensors`` holds

- ``kv``: ``[layers, 2, kv_heads, tokens, head_dim]`` (K then V), keys after RoPE in the Hugging
  Face layout (what transformers' cache holds; vLLM's attention caches the same numbers);
- ``token_ids``: ``[tokens]`` int64, the prefix the K/V were computed from (positions 0..T-1);
- header metadata ``kvbridge.format`` / ``kvbridge.version`` / ``kvbridge.manifest`` (JSON): the
  model's identity (config fingerprint and the sha256 of its weight files), dtype, geometry, RoPE
  table, whether the cache is ``approximate`` (transferred or steered: never the model's own exact
  cache) and where it came from (``provenance``).

Nothing here imports vLLM: the connector and the engine plugin share it, and the tests run it in
kvbridge's own environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

FORMAT = "kvbridge-vllm-prefix"
VERSION = 1
SUFFIX = ".safetensors"
KEYS_LAYOUT = "post-RoPE, Hugging Face rotary layout"


class EntryError(ValueError):
    """An entry that cannot be read or does not fit the model (one line: what and why)."""


# -- the model an entry is for ---------------------------------------------------------------------
@dataclass(frozen=True)
class ModelIdentity:
    """What an entry is checked against: the folder vLLM serves, as kvbridge reads it."""

    name: str
    model_type: str
    config_fingerprint: str
    weights_digest: str | None
    num_layers: int
    num_kv_heads: int
    head_dim: int
    rope: dict = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "model_type": self.model_type,
            "config_fingerprint": self.config_fingerprint,
            "weights_digest": self.weights_digest,
            "num_layers": self.num_layers,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rope": dict(self.rope),
        }


def rope_record(spec) -> dict:
    r = spec.rope
    if r is None:
        return {}
    return {"type": r.rope_type, "theta": float(r.theta), "rotary_dim": int(r.rotary_dim), "interleaved": r.interleaved}


def model_identity(model: Any, host=None) -> ModelIdentity:
    """The :class:`ModelIdentity` of ``model`` (a folder vLLM loads, or a reference resolving to one).

    Refuses (``kvbridge.errors.ConfigError``) what vLLM 0.32 cannot serve from a folder (a GGUF) and
    caches this store cannot describe (per-layer geometry, sliding windows, MLA, recurrent state)."""
    from kvbridge.errors import ConfigError
    from kvbridge.models import resolve
    from kvbridge.models.fingerprint import config_fingerprint

    if isinstance(model, ModelIdentity):
        return model
    ref = resolve(str(model), host=host)
    if ref.gguf_file:
        raise ConfigError(
            f"{ref.ref}: vLLM 0.32 has no GGUF loader; it serves safetensors folders",
            f"write one with `kvbridge models materialize {ref.ref} --out DIR` and pass DIR",
        )
    if not ref.folder or not ref.weight_files():
        raise ConfigError(
            f"{ref.ref}: no weight files to identify the model vLLM serves",
            "pass the safetensors folder vLLM loads (kvbridge models materialize writes one)",
        )
    spec = ref.spec(host=host)
    if not spec.uniform_kv or spec.sliding_window or spec.cache_format != "kv" or spec.state_layers:
        raise ConfigError(
            f"{ref.ref}: the vllm engine stores one K/V geometry for every layer of a full-attention "
            f"model; {spec.model_type} caches otherwise",
            "use a model with one KV geometry and no sliding-window or recurrent layers",
        )
    return ModelIdentity(
        name=ref.name,
        model_type=spec.model_type,
        config_fingerprint=config_fingerprint(ref.config),
        weights_digest=ref.weights_digest(),
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        rope=rope_record(spec),
    )


# -- writing ---------------------------------------------------------------------------------------
def tokens_digest(token_ids: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps([int(t) for t in token_ids]).encode()).hexdigest()


def entry_name(token_ids: Sequence[int], model: ModelIdentity) -> str:
    """``<16 hex>.safetensors``: one name per (model, token ids)."""
    key = hashlib.sha256(f"{model.config_fingerprint}:{model.weights_digest}:{tokens_digest(token_ids)}".encode())
    return key.hexdigest()[:16] + SUFFIX


def entry_bytes(
    kv, token_ids, model: ModelIdentity, *, approximate: bool, provenance: str, extra: dict | None = None
) -> bytes:
    """The bytes of an entry: ``kv`` ``[L, 2, H, T, D]`` (any float dtype), ``token_ids`` ``[T]``."""
    import torch
    from safetensors.torch import save

    from kvbridge.version import __version__

    ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1).contiguous()
    want = (model.num_layers, 2, model.num_kv_heads, int(ids.numel()), model.head_dim)
    if tuple(kv.shape) != want:
        raise EntryError(f"K/V of shape {tuple(kv.shape)}; {model.name} caches {want} [layers, 2, heads, tokens, dim]")
    manifest = {
        "model": model.to_dict(),
        "dtype": str(kv.dtype).removeprefix("torch."),
        "num_tokens": int(ids.numel()),
        "keys": KEYS_LAYOUT,
        "approximate": bool(approximate),
        "provenance": provenance,
        "token_ids_sha256": tokens_digest(ids.tolist()),
        "kvbridge_version": __version__,
        **(extra or {}),
    }
    meta = {"kvbridge.format": FORMAT, "kvbridge.version": str(VERSION), "kvbridge.manifest": json.dumps(manifest)}
    return save({"kv": kv.detach().to("cpu").contiguous(), "token_ids": ids}, metadata=meta)


def write_entry(data: bytes, out: str | os.PathLike, token_ids: Sequence[int], model: ModelIdentity) -> Path:
    """Write ``data`` atomically: into the store folder ``out`` (created; named by
    :func:`entry_name`) or, when ``out`` ends with ``.safetensors``, to that file."""
    from kvbridge.artifacts import write_file_atomic

    out = Path(out)
    if out.suffix == SUFFIX and not out.is_dir():
        path = out
    else:
        out.mkdir(parents=True, exist_ok=True)
        path = out / entry_name(token_ids, model)
    write_file_atomic(path, data)
    return path


# -- tensor parallel saves: one part per rank, joined by whichever rank writes the last part ----------
def part_path(folder: str | os.PathLike, token_ids: Sequence[int], model: ModelIdentity, rank: int, tp: int) -> Path:
    """Where rank ``rank`` of ``tp`` writes its KV heads of an entry: a hidden file the scan skips."""
    stem = entry_name(token_ids, model).removesuffix(SUFFIX)
    return Path(folder) / f".{stem}.rank{rank}of{tp}.part"


def write_part(kv, heads: Sequence[int], token_ids, model: ModelIdentity, folder, *, rank: int, tp: int) -> Path:
    """Rank ``rank``'s K/V ``[L, 2, len(heads), T, D]`` of an entry, with the global head indices, written
    atomically next to the store's entries."""
    import torch
    from safetensors.torch import save

    from kvbridge.artifacts import write_file_atomic

    Path(folder).mkdir(parents=True, exist_ok=True)
    data = save(
        {
            "kv": kv.detach().to("cpu").contiguous(),
            "heads": torch.tensor(list(heads), dtype=torch.long),
            "token_ids": torch.as_tensor(list(token_ids), dtype=torch.long),
        }
    )
    path = part_path(folder, token_ids, model, rank, tp)
    write_file_atomic(path, data)
    return path


def join_parts(folder, token_ids, model: ModelIdentity, *, tp: int, approximate: bool, provenance: str) -> Path | None:
    """The entry joined from the ``tp`` ranks' parts once all are written (``None`` before that, or when
    another rank is joining them); the parts are removed. Each rank calls it after writing its own part:
    the last writer sees every part, and an exclusive marker file lets one rank of several join."""
    import torch
    from safetensors.torch import load_file

    parts = [part_path(folder, token_ids, model, r, tp) for r in range(tp)]
    if not all(p.is_file() for p in parts):
        return None
    marker = parts[0].with_suffix(".joining")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return None
    os.close(fd)
    try:
        loaded = [load_file(str(p)) for p in parts]
        ids = [int(x) for x in token_ids]
        total = model.num_kv_heads
        by_head: dict = {}
        for part in loaded:
            if part["token_ids"].tolist() != ids:
                raise EntryError(f"a rank's part of {entry_name(ids, model)} holds other token ids")
            for j, h in enumerate(part["heads"].tolist()):
                by_head.setdefault(int(h), part["kv"][:, :, j])  # replicated heads: the first rank's copy
        if sorted(by_head) != list(range(total)):
            raise EntryError(f"the ranks' parts hold KV heads {sorted(by_head)}, not 0..{total - 1}")
        kv = torch.stack([by_head[h] for h in range(total)], dim=2)
        data = entry_bytes(
            kv, ids, model, approximate=approximate, provenance=provenance, extra={"tensor_parallel": tp}
        )
        path = write_entry(data, folder, ids, model)
        for p in parts:
            p.unlink(missing_ok=True)
        return path
    finally:
        marker.unlink(missing_ok=True)


# -- reading ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """A store entry's header: what it holds, read without its K/V."""

    path: str
    manifest: dict = field(hash=False)
    token_ids: tuple
    kv_shape: tuple
    kv_dtype: str

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def approximate(self) -> bool:
        return bool(self.manifest.get("approximate", True))

    @property
    def name(self) -> str:
        return Path(self.path).name


_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def _header(path: Path) -> dict:
    """The safetensors header, with the file's length checked against it (a truncated file fails)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise EntryError(f"{path}: {size} bytes, not a safetensors file (truncated?)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100 << 20):
            raise EntryError(f"{path}: header of {n} bytes in a {size}-byte file (truncated or not safetensors)")
        try:
            header = json.loads(fh.read(n))
        except ValueError:
            raise EntryError(f"{path}: the safetensors header is not JSON (truncated or corrupt)") from None
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        raise EntryError(f"{path}: {size} bytes, the header promises {8 + n + end} (truncated or padded)")
    return header


def read_entry_header(path: str | os.PathLike) -> Entry:
    """The :class:`Entry` of ``path``; :class:`EntryError` (one line) for anything unreadable."""
    from safetensors import safe_open

    path = Path(path)
    try:
        header = _header(path)
    except OSError as exc:
        raise EntryError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    meta = header.get("__metadata__") or {}
    if meta.get("kvbridge.format") != FORMAT:
        raise EntryError(f"{path}: not a kvbridge vLLM store entry (format {meta.get('kvbridge.format')!r})")
    if meta.get("kvbridge.version") != str(VERSION):
        raise EntryError(f"{path}: store format version {meta.get('kvbridge.version')!r}, this plugin reads {VERSION}")
    try:
        manifest = json.loads(meta["kvbridge.manifest"])
        kv = header["kv"]
        shape, dtype = tuple(int(x) for x in kv["shape"]), _DTYPES.get(kv["dtype"], kv["dtype"])
        with safe_open(str(path), "pt") as fh:
            ids = tuple(int(t) for t in fh.get_tensor("token_ids").tolist())
    except (KeyError, ValueError, TypeError) as exc:
        raise EntryError(f"{path}: malformed entry ({type(exc).__name__}: {exc})") from None
    if len(shape) != 5 or shape[1] != 2 or shape[3] != len(ids):
        raise EntryError(f"{path}: kv of shape {shape} for {len(ids)} token ids (expected [L, 2, H, T, D])")
    if manifest.get("token_ids_sha256") != tokens_digest(ids):
        raise EntryError(f"{path}: the token ids do not match their recorded digest")
    return Entry(path=str(path), manifest=manifest, token_ids=ids, kv_shape=shape, kv_dtype=dtype)


def mismatch(entry: Entry, model: ModelIdentity, dtype: str) -> str | None:
    """Why ``entry`` cannot be loaded into ``model`` running a ``dtype`` cache (one phrase), or None."""
    m = entry.manifest.get("model") or {}
    L, _, H, _, D = entry.kv_shape
    if (L, H, D) != (model.num_layers, model.num_kv_heads, model.head_dim):
        return (
            f"geometry {L} layers x {H} KV heads x {D}, the served model caches {model.num_layers} x "
            f"{model.num_kv_heads} x {model.head_dim}"
        )
    if m.get("config_fingerprint") != model.config_fingerprint:
        return (
            f"made for model {m.get('name')!r} (config sha256 {str(m.get('config_fingerprint'))[:12]}), "
            f"vLLM serves {model.name!r} (config sha256 {model.config_fingerprint[:12]})"
        )
    if m.get("weights_digest") != model.weights_digest:
        return (
            f"made for weights sha256 {str(m.get('weights_digest'))[:12]}, vLLM serves "
            f"{str(model.weights_digest)[:12]} ({model.name})"
        )
    if m.get("rope") != model.rope:
        return f"keys rotated with RoPE {m.get('rope')}, the model uses {model.rope}"
    if entry.kv_dtype != dtype:
        return f"dtype {entry.kv_dtype}, vLLM's cache is {dtype} (export the entry with --dtype {dtype})"
    return None


def read_kv(entry: Entry, *, start: int, stop: int, heads: Sequence[int] | None = None):
    """``kv[:, :, heads, start:stop, :]`` of the entry (only those rows read from disk)."""
    import torch
    from safetensors import safe_open

    with safe_open(entry.path, "pt") as fh:
        sl = fh.get_slice("kv")
        shape = sl.get_shape()
        if not 0 <= start <= stop <= shape[3]:
            raise EntryError(f"{entry.path}: tokens {start}..{stop} outside the entry's {shape[3]}")
        if heads is None:
            return sl[:, :, :, start:stop, :]
        lo, hi = min(heads), max(heads) + 1
        kv = sl[:, :, lo:hi, start:stop, :]
    idx = torch.as_tensor([h - lo for h in heads], dtype=torch.long)
    return kv.index_select(2, idx) if list(idx.tolist()) != list(range(hi - lo)) else kv


# -- matching and tensor parallelism --------------------------------------------------------------
def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def best_match(prompt: Sequence[int], entries: Iterable[Entry]) -> tuple[Entry | None, int, Entry | None, int]:
    """``(entry, n, closest, k)``: the longest entry whose token ids are a prefix of ``prompt``
    and how many of its tokens to load (all of them, but never the prompt's last token: vLLM
    computes at least one), or ``(None, 0, closest, k)`` with the entry agreeing longest (``k``
    tokens) for the log line."""
    best, closest, k_best = None, None, -1
    for e in entries:
        k = common_prefix(prompt, e.token_ids)
        if k == e.num_tokens and (best is None or e.num_tokens > best.num_tokens):
            best = e
        if k > k_best:
            closest, k_best = e, k
    if best is None:
        return None, 0, closest, max(k_best, 0)
    return best, min(best.num_tokens, len(prompt) - 1), closest, k_best


def rank_heads(total_kv_heads: int, tp_size: int, rank: int) -> list[int]:
    """The KV heads rank ``rank`` of ``tp_size`` caches, as vLLM shards them: contiguous equal
    slices, or (more ranks than heads) head ``rank // (tp_size // total_kv_heads)`` replicated."""
    if tp_size < 1 or not 0 <= rank < tp_size:
        raise ValueError(f"rank {rank} of {tp_size}")
    if total_kv_heads >= tp_size:
        if total_kv_heads % tp_size:
            raise ValueError(f"{total_kv_heads} KV heads cannot be split over {tp_size} ranks")
        per = total_kv_heads // tp_size
        return list(range(rank * per, (rank + 1) * per))
    if tp_size % total_kv_heads:
        raise ValueError(f"{tp_size} ranks cannot replicate {total_kv_heads} KV heads evenly")
    return [rank // (tp_size // total_kv_heads)]


def scan(folder: str | os.PathLike, known: dict | None = None) -> dict:
    """``{path: Entry | EntryError}`` for every ``*.safetensors`` in ``folder``; ``known`` (the last
    scan, keyed by path, with ``(size, mtime_ns)`` stamps) spares re-reading unchanged files."""
    out: dict = {}
    folder = Path(folder)
    try:
        names = sorted(p for p in folder.iterdir() if p.suffix == SUFFIX and not p.name.startswith("."))
    except OSError:
        return out
    for p in names:
        try:
            st = p.stat()
        except OSError:
            continue
        stamp = (st.st_size, st.st_mtime_ns)
        if known and str(p) in known and known[str(p)][0] == stamp:
            out[str(p)] = known[str(p)]
            continue
        try:
            out[str(p)] = (stamp, read_entry_header(p))
        except EntryError as exc:
            out[str(p)] = (stamp, exc)
    return out


__all__ = [
    "FORMAT",
    "VERSION",
    "Entry",
    "EntryError",
    "ModelIdentity",
    "model_identity",
    "entry_bytes",
    "entry_name",
    "part_path",
    "write_part",
    "join_parts",
    "write_entry",
    "read_entry_header",
    "read_kv",
    "mismatch",
    "best_match",
    "common_prefix",
    "rank_heads",
    "scan",
]
