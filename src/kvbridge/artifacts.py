"""Artifacts on disk: a folder with one safetensors file + ``manifest.json``. Never pickle.

Writes are atomic: everything goes into a temporary sibling folder that is renamed into
place only when complete, so an interrupted or failed write leaves nothing half-written.
Reads verify the tensor file's sha256 against the manifest before loading a byte of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from kvbridge import __version__
from kvbridge.errors import ArtifactError

if TYPE_CHECKING:  # pragma: no cover
    from kvbridge.kvstate import KVState

MANIFEST = "manifest.json"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextmanager
def atomic_dir(out: Path | str, *, force: bool = False) -> Iterator[Path]:
    """Yield a temp folder next to ``out``; on success it replaces ``out`` in one rename."""
    out = Path(out)
    if out.exists() and not force:
        raise ArtifactError(f"{out} already exists", "choose another --out or pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_artifact(out: Path | str, tensors: dict, manifest: dict, *, tensor_file: str,
                   force: bool = False) -> Path:
    """Write ``tensors`` (safetensors) and ``manifest`` (+ sha256 of the tensor file) atomically."""
    from safetensors.torch import save_file

    for name, t in tensors.items():
        import torch

        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ArtifactError(f"tensor {name!r} has NaN/inf values; refusing to write {out}",
                                "recompute the state; a mapping that produced it may be broken")
    with atomic_dir(out, force=force) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp / tensor_file))
        full = dict(manifest)
        full.setdefault("kvbridge_version", __version__)
        full["tensor_file"] = tensor_file
        full["tensor_sha256"] = sha256_file(tmp / tensor_file)
        (tmp / MANIFEST).write_text(json.dumps(full, indent=2, sort_keys=True, default=str) + "\n")
    return Path(out)


def read_manifest(folder: Path | str, *, kind: str = "artifact") -> dict:
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise ArtifactError(f"{folder} is not a {kind} folder", f"pass the folder that holds {MANIFEST}")
    if not path.is_file():
        raise ArtifactError(f"{path} is missing", f"pass a {kind} folder written by kvbridge")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})",
                            f"re-create the {kind}") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path} must hold a JSON object", f"re-create the {kind}")
    return data


def read_artifact(folder: Path | str, *, kind: str = "artifact", verify: bool = True) -> tuple[dict, dict]:
    """``(manifest, tensors)`` of an artifact folder, checksum verified before loading."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    manifest = read_manifest(folder, kind=kind)
    name = manifest.get("tensor_file")
    if not name or "/" in name or name.startswith("."):
        raise ArtifactError(f"{folder / MANIFEST} has no valid 'tensor_file'", f"re-create the {kind}")
    path = folder / name
    if not path.is_file():
        raise ArtifactError(f"{path} is missing", f"re-create the {kind}")
    if verify:
        got = sha256_file(path)
        if got != manifest.get("tensor_sha256"):
            raise ArtifactError(
                f"{path} checksum mismatch (sha256 {got[:12]}... != manifest {str(manifest.get('tensor_sha256'))[:12]}...): "
                "the file is corrupt, truncated or was replaced", f"re-create the {kind}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"{path} is not a readable safetensors file ({exc})", f"re-create the {kind}") from None
    return manifest, tensors


# -- KVState <-> tensors ----------------------------------------------------------------------
def state_tensors(state: "KVState") -> dict:
    out: dict[str, Any] = {"token_ids": state.token_ids, "positions": state.positions}
    for i, (k, v) in enumerate(zip(state.keys, state.values)):
        out[f"layers.{i}.keys"] = k
        out[f"layers.{i}.values"] = v
    if state.rope_lengths is not None:
        out["rope_lengths"] = state.rope_lengths
    return out


def state_manifest(state: "KVState") -> dict:
    return {
        "spec": state.spec.to_dict(),
        "num_layers": state.num_layers,
        "num_tokens": state.num_tokens,
        "batch_size": state.batch_size,
        "dtype": str(state.dtype).removeprefix("torch."),
        "rope_applied": state.rope_applied,
        "approximate": state.approximate,
        "model_fingerprint": state.model_fingerprint,
    }


def state_from_tensors(tensors: dict, manifest: dict) -> "KVState":
    from kvbridge.kvstate import KVState
    from kvbridge.check.spec import ModelSpec

    try:
        n = int(manifest["num_layers"])
        keys = tuple(tensors[f"layers.{i}.keys"] for i in range(n))
        values = tuple(tensors[f"layers.{i}.values"] for i in range(n))
        spec = ModelSpec.from_dict(manifest["spec"])
        return KVState(keys=keys, values=values, token_ids=tensors["token_ids"], positions=tensors["positions"],
                       spec=spec, rope_applied=bool(manifest.get("rope_applied", True)),
                       rope_lengths=tensors.get("rope_lengths"),
                       model_fingerprint=manifest.get("model_fingerprint", ""),
                       approximate=bool(manifest.get("approximate", False)))
    except KeyError as exc:
        raise ArtifactError(f"artifact is missing {exc.args[0]!r}", "re-create it with this kvbridge version") from None
