"""Artifacts on disk: a folder with one safetensors file + ``manifest.json``. Never pickle.

The one write path of kvbridge (mappings, packs, eval reports all go through it):

- **atomic**: everything goes into a temporary sibling folder ``.<name>.tmp-*``; every file's
  data is made durable, then the folder is renamed into place, and the parent fsynced
  (:mod:`kvbridge.durable`: one journal commit on ext4/XFS, an fsync per file elsewhere). A killed or
  failed write leaves the previous artifact as it was; a replaced artifact is moved aside
  (``.<name>.old-*``) only for the instant between two renames, and the next writer restores
  it if a crash hit exactly there.
- **owned**: each artifact folder carries a marker file (:data:`MARKER`: kind + writer).
  ``--overwrite`` (``--force`` on older commands) replaces only a folder kvbridge wrote with
  the SAME kind; a model folder, a foreign folder, a file, a symbolic link, or an artifact of
  another kind (a mapping when writing a pack) is refused, whatever the flag says.
- **locked**: a writer holds an exclusive lock (``.<name>.lock``, ``flock``: released by the
  kernel even on ``kill -9``) for the whole run that produces the output, so a second writer
  to the same output fails at once with a clear error instead of racing.

Reads verify the tensor file's sha256 against the manifest before loading a byte of it; the
callers then check each tensor's dtype and shape against what the manifest implies
(:func:`kvbridge.check.validate.tensors_match`), so a re-written file whose checksum was
"fixed up" is still refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

from kvbridge.check.validate import load_json, tensors_match
from kvbridge.durable import commit_file, commit_tree, start_writeback
from kvbridge.errors import ArtifactError, from_exception
from kvbridge.faults import fault_point
from kvbridge.threads import thread_pool
from kvbridge.version import __version__

MANIFEST = "manifest.json"
#: ownership marker inside every artifact folder kvbridge writes: {"kind", "writer", "version"}
MARKER = ".kvbridge-artifact.json"
WRITER = "kvbridge"
#: tensor files up to this size are read into memory once (hashed and parsed from the same bytes)
READ_ONCE_BYTES = 64 << 20


class LockError(ArtifactError):
    """Another process is writing the same output."""


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


#: the torch dtypes written directly with their safetensors names, in the format's own order (its enum:
#: a file lists its tensors by this rank descending, then by name)
_ST_ORDER = (
    ("bool", "BOOL"),
    ("uint8", "U8"),
    ("int8", "I8"),
    ("float8_e5m2", "F8_E5M2"),
    ("float8_e4m3fn", "F8_E4M3"),
    ("int16", "I16"),
    ("uint16", "U16"),
    ("float16", "F16"),
    ("bfloat16", "BF16"),
    ("int32", "I32"),
    ("uint32", "U32"),
    ("float32", "F32"),
    ("float64", "F64"),
    ("int64", "I64"),
    ("uint64", "U64"),
)
_ST_DTYPES = dict(_ST_ORDER)
_ST_RANK = {name: i for i, (_, name) in enumerate(_ST_ORDER)}
_WRITE_CHUNK = 1 << 22
#: bytes per hand-off to the checksum thread, and per request to start writing out (durable.start_writeback)
_BATCH_BYTES = 8 << 20


class NonFiniteError(ArtifactError):
    """A tensor to be written holds NaN or inf (``save_safetensors(..., finite=True)``)."""


_NP_FLOATS = {"float64": "<f8", "float32": "<f4", "float16": "<f2"}


def _check_finite(name: str, t, block=None) -> None:
    """Refuse NaN/inf in a float tensor (or one ``block`` of its bytes): numpy, single-threaded and
    chunk-sized (torch's ``isfinite(t).all()`` allocated a mask as large as the tensor and spent
    most of a save on the thread pool)."""
    if not t.is_floating_point():
        return
    if block is not None:  # the caller hands over blocks of the _NP_FLOATS dtypes only
        import numpy as np

        ok = bool(np.isfinite(np.frombuffer(block, dtype=_NP_FLOATS[str(t.dtype).removeprefix("torch.")])).all())
    else:
        ok = bool(t.isfinite().all())
    if not ok:
        raise NonFiniteError(
            f"tensor {name!r} has NaN/inf values", "recompute the state; a mapping that produced it may be broken"
        )


def save_safetensors(tensors: dict, path: Path | str, *, finite: bool = False) -> str:
    """Write ``tensors`` as a safetensors file and return its sha256, hashed while writing.

    The bytes are those of ``safetensors.torch.save_file`` (same header, same order: the format's
    dtype rank descending, then name; checked by a test): a compact JSON header padded with spaces to 8
    bytes, then each tensor's raw little-endian bytes, read straight from the tensor's memory
    (no serialised copy, no second read of the file for the checksum). Tensors of a dtype the
    table does not know go through ``save_file`` and are hashed after.
    """
    import torch

    path = Path(path)
    items = {k: v.detach() for k, v in tensors.items()}
    names = {k: str(v.dtype).removeprefix("torch.") for k, v in items.items()}
    if sys.byteorder != "little" or any(n not in _ST_DTYPES for n in names.values()):
        from safetensors.torch import save_file

        if finite:
            for k, v in items.items():
                _check_finite(k, v)
        save_file({k: v.contiguous().cpu() for k, v in items.items()}, str(path))
        return sha256_file(path)
    order = sorted(items, key=lambda k: (-_ST_RANK[_ST_DTYPES[names[k]]], k))
    header, offset = [], 0
    for k in order:
        t = items[k]
        n = t.numel() * t.element_size()
        header.append(
            f'{json.dumps(k)}:{{"dtype":"{_ST_DTYPES[names[k]]}","shape":'
            f'[{",".join(str(int(d)) for d in t.shape)}],"data_offsets":[{offset},{offset + n}]}}'
        )
        offset += n
    text = ("{" + ",".join(header) + "}").encode("utf-8")
    text += b" " * (-len(text) % 8)
    head = len(text).to_bytes(8, "little") + text
    h = hashlib.sha256(head)

    def digest(batch) -> None:  # hashlib and numpy release the GIL: runs beside the writes
        for k, t, block in batch:
            if finite and names[k] in _NP_FLOATS:
                _check_finite(k, t, block)
            h.update(block)

    def batches():  # (name, tensor, bytes) blocks, about _BATCH_BYTES a batch, in file order
        batch, size = [], 0
        for k in order:
            t = items[k]
            if t.numel() == 0:
                continue
            t = t.cpu().contiguous()  # no copy for a contiguous CPU tensor
            if finite and names[k] not in _NP_FLOATS:
                _check_finite(k, t)
            raw = memoryview(t.reshape(-1).view(torch.uint8).numpy())
            for a in range(0, len(raw), _WRITE_CHUNK):
                batch.append((k, t, raw[a : a + _WRITE_CHUNK]))
                size += len(batch[-1][2])
                if size >= _BATCH_BYTES:
                    yield batch
                    batch, size = [], 0
        if batch:
            yield batch

    pool = thread_pool("kvbridge-sha256", 1)  # started once: a thread start per save cost ~50 ms on a busy machine
    with open(path, "wb", buffering=0) as fh:
        _write_all(fh, head)
        pos, pending = len(head), None
        for batch in batches():
            if pending is not None:
                pending.result()  # batches are hashed in order
            pending = pool.submit(digest, batch)  # one hand-off per batch: cheap on a busy machine
            start = pos
            for _, _, block in batch:
                _write_all(fh, block)
                pos += len(block)
            start_writeback(fh.fileno(), start, pos - start)  # the final flush then has little left
        if pending is not None:
            pending.result()
    return h.hexdigest()


def _write_all(fh, data) -> None:
    view = memoryview(data)
    while view:
        view = view[fh.write(view) :]


# -- ownership ---------------------------------------------------------------------------------------
def artifact_kind(folder: Path | str) -> str | None:
    """The kind of a folder kvbridge wrote (marker, or a legacy manifest's ``kind``), else None."""
    # the marker, else (written before markers existed) a manifest with kvbridge's version and a kind
    for name, ours in ((MARKER, lambda d: d.get("writer") == WRITER), (MANIFEST, lambda d: d.get("kvbridge_version"))):
        try:
            data = json.loads((Path(folder) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(data, dict) and ours(data) and isinstance(data.get("kind"), str):
            return data["kind"]
    return None


def check_replaceable(out: Path | str, kind: str, *, overwrite: bool, flag: str = "--overwrite") -> None:
    """Refuse to write ``out`` unless it is absent, an empty folder, or (with ``overwrite``) a
    folder kvbridge wrote with the same ``kind``."""
    out = Path(out)
    if out.is_symlink():
        raise ArtifactError(
            f"{out} is a {'' if out.exists() else 'dangling '}symbolic link (to {os.readlink(out)}); "
            "kvbridge never writes through links",
            "remove the link or choose another output path",
        )
    if not out.exists():
        parent = out.parent
        if parent.exists() and not parent.is_dir():
            raise ArtifactError(
                f"{out}: the parent {parent} is a file, not a folder", "choose an output path inside a folder"
            )
        return
    if not out.is_dir():
        raise ArtifactError(
            f"{out} is a file, not a kvbridge {kind} folder; refusing to replace it", "choose another output path"
        )
    try:
        empty = not any(out.iterdir())
    except OSError as exc:
        raise from_exception(exc) from None
    if empty:
        return
    have = artifact_kind(out)
    even = f" (even with {flag})" if flag else ""
    if have is None:
        what = "a model folder" if (out / "config.json").exists() else "a folder kvbridge did not write"
        raise ArtifactError(f"{out} is {what}; refusing to replace it{even}", "choose a new output path")
    if have != kind:
        raise ArtifactError(
            f"{out} holds a {have}, not a {kind}; refusing to replace it{even}", "choose another output path"
        )
    if not overwrite:
        raise ArtifactError(f"{out} already exists", f"choose another output path or pass {flag} to replace it")


# -- locking ------------------------------------------------------------------------------------------
#: the output locks this process holds (:func:`output_lock` is re-entrant)
_HELD: set[str] = set()


def lock_path(out: Path | str) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.lock"


@contextmanager
def output_lock(out: Path | str) -> Iterator[Path]:
    """Hold the exclusive write lock of ``out`` (re-entrant within a process)."""
    out = Path(out)
    path = lock_path(out)
    key = str(path.resolve()) if path.parent.exists() else str(path.absolute())
    if key in _HELD:  # held by an outer call of this process: it releases the lock
        yield path
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+", encoding="utf-8")
    try:
        try:
            import fcntl

            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # pragma: no cover - no flock (Windows): best effort, no lock
            pass
        except OSError:
            fh.seek(0)
            who = fh.read().strip() or "another process"
            raise LockError(
                f"{out} is being written by another kvbridge run ({who})",
                "wait for it to finish or choose another output path",
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        _HELD.add(key)
        recover(out)
        try:
            yield path
        finally:
            _HELD.discard(key)
            with contextlib.suppress(OSError):
                path.unlink()  # while still locked: no other writer holds this inode
    finally:
        fh.close()


def recover(out: Path | str) -> None:
    """Under the lock: restore an artifact a crash left moved aside; remove stale temp folders."""
    out = Path(out)
    parent = out.parent
    if not parent.is_dir():
        return
    olds = sorted(parent.glob(f".{out.name}.old-*"))
    if olds and not out.exists() and not out.is_symlink():
        olds[-1].rename(out)
        olds = olds[:-1]
    for stale in olds + sorted(parent.glob(f".{out.name}.tmp-*")):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)


# -- atomic writes --------------------------------------------------------------------------------------
@contextmanager
def atomic_dir(
    out: Path | str,
    *,
    kind: str = "artifact",
    overwrite: bool = False,
    flag: str = "--overwrite",
) -> Iterator[Path]:
    """Yield a temp folder next to ``out``; on success it replaces ``out`` in one rename.

    ``out`` is checked first (:func:`check_replaceable`) and locked for the duration. The temp
    folder gets the ownership marker; on any exception it is removed and ``out`` is untouched.
    """
    out = Path(out)
    check_replaceable(out, kind, overwrite=overwrite, flag=flag)
    with output_lock(out):
        check_replaceable(out, kind, overwrite=overwrite, flag=flag)  # again, now that it is ours
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; an artifact gets ordinary permissions
        try:
            yield tmp
            fault_point("artifact.write")
            (tmp / MARKER).write_text(
                json.dumps({"kind": kind, "writer": WRITER, "version": __version__}) + "\n", encoding="utf-8"
            )

            def rename() -> None:
                if out.exists():
                    old = out.with_name(f".{out.name}.old-{os.getpid()}")
                    out.rename(old)
                    tmp.rename(out)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    tmp.rename(out)

            commit_tree(tmp, rename)  # data of every file durable before the rename is (one commit)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def write_file_atomic(path: Path | str, data: bytes | str) -> Path:
    """Write one file atomically: temp sibling, fsync, rename (for JSON/JSONL progress files)."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        commit_file(Path(tmp), lambda: os.replace(tmp, path))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def write_artifact(
    out: Path | str,
    tensors: dict,
    manifest: dict,
    *,
    tensor_file: str,
    force: bool = False,
    overwrite: bool = False,
    kind: str | None = None,
    flag: str = "--overwrite",
) -> Path:
    """Write ``tensors`` (safetensors) and ``manifest`` (+ sha256 of the tensor file) atomically."""
    kind = kind or str(manifest.get("kind") or "artifact")
    with atomic_dir(out, kind=kind, overwrite=overwrite or force, flag=flag) as tmp:
        try:  # hashed and checked for NaN/inf while written: one pass over the bytes, no second read
            digest = save_safetensors(tensors, tmp / tensor_file, finite=True)
        except NonFiniteError as exc:  # the temp folder goes with the exception: nothing is written
            raise ArtifactError(f"{exc.what}; refusing to write {out}", exc.fix) from None
        full = {"kvbridge_version": __version__, **manifest, "tensor_file": tensor_file, "tensor_sha256": digest}
        full["tensors"] = {
            k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)} for k, v in tensors.items()
        }
        (tmp / MANIFEST).write_text(json.dumps(full, indent=2, sort_keys=True, default=str) + "\n")
    return Path(out)


def library_versions() -> dict:
    """The library versions an artifact's manifest records (what decides how its tensors were made)."""
    import torch
    import transformers

    return {
        "transformers_version": transformers.__version__,
        "torch_version": str(torch.__version__),
        "kvbridge_version": __version__,
    }


def read_manifest(folder: Path | str, *, kind: str = "artifact") -> dict:
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise ArtifactError(f"{folder} is not a {kind} folder", f"pass the folder that holds {MANIFEST}")
    if not path.is_file():
        raise ArtifactError(f"{path} is missing", f"pass a {kind} folder written by kvbridge")
    return load_json(path, what=f"{kind} manifest", error=ArtifactError)


def check_kind(manifest: Mapping, kind: str, schema_version: int, where: Path | str, what: str, fix: str) -> None:
    """Refuse a manifest whose ``kind`` is not ``kind`` (``fix``: what to pass instead) or whose
    ``schema_version`` is not an int at most ``schema_version`` (upgrade kvbridge)."""
    if manifest.get("kind") != kind:
        raise ArtifactError(f"{where} is not a {what} (kind {manifest.get('kind')!r})", fix)
    version = manifest.get("schema_version")
    if not isinstance(version, int) or version > schema_version:
        raise ArtifactError(
            f"{where}: {what} schema_version {version!r} is newer than this kvbridge reads ({schema_version})",
            "upgrade kvbridge",
        )


def read_artifact(folder: Path | str, *, kind: str = "artifact") -> tuple[dict, dict]:
    """``(manifest, tensors)`` of an artifact folder, checksum verified before loading.

    When the manifest lists its tensors (``tensors: {name: {dtype, shape}}``, written since
    the marker was introduced) every tensor is checked against that list too.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load as load_bytes, load_file

    folder = Path(folder)
    manifest = read_manifest(folder, kind=kind)
    name = manifest.get("tensor_file")
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
        raise ArtifactError(f"{folder / MANIFEST} has no valid 'tensor_file'", f"re-create the {kind}")
    path = folder / name
    if not path.is_file():
        raise ArtifactError(f"{path} is missing", f"re-create the {kind}")
    data = path.read_bytes() if path.stat().st_size <= READ_ONCE_BYTES else None  # small: read once, hash and parse
    got = sha256_file(path) if data is None else hashlib.sha256(data).hexdigest()
    if got != manifest.get("tensor_sha256"):
        raise ArtifactError(
            f"{path} checksum mismatch (sha256 {got[:12]}... != manifest {str(manifest.get('tensor_sha256'))[:12]}...): "
            "the file is corrupt, truncated or was replaced",
            f"re-create the {kind}",
        )
    try:
        tensors = load_file(str(path)) if data is None else load_bytes(data)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ArtifactError(
            f"{path} is not a readable safetensors file ({' '.join(str(exc).split())[:120]})", f"re-create the {kind}"
        ) from None
    listed = manifest.get("tensors")
    if listed is not None:
        if not isinstance(listed, dict) or not all(isinstance(v, dict) for v in listed.values()):
            raise ArtifactError(
                f"{folder / MANIFEST} field 'tensors' must map names to {{dtype, shape}}", f"re-create the {kind}"
            )
        expected = {}
        for k, v in listed.items():
            shape = v.get("shape")
            if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
                raise ArtifactError(
                    f"{folder / MANIFEST} field 'tensors.{k}.shape' must be a list of integers", f"re-create the {kind}"
                )
            expected[k] = (str(v.get("dtype")), tuple(shape))
        tensors_match(tensors, expected, str(path), fix=f"re-create the {kind}")
    return manifest, tensors
