"""Steering-vector folders: ``vector.safetensors`` + ``manifest.json``, versioned like prefix packs.

The manifest (kind ``kvbridge.steering-vector``, :data:`SCHEMA_VERSION`) records what decides
what the directions mean: the model (id, type, config / weights / spec fingerprints, geometry),
the tokenizer fingerprint, the positions read (``last`` / ``final`` / ``span``), the key space
(``content``: RoPE stripped), the method (``mean`` / ``pca`` / ``transferred(...)``), the number
and digest of the pairs, the layers and every direction's norm, and the library versions.
Tensors: ``keys.{i}`` / ``values.{i}`` ``[kv_heads, head_dim]`` and ``residual.{i}`` ``[hidden]``,
float32. Never pickle; written atomically through :func:`kvbridge.artifacts.write_artifact`
(nothing half-written), checksum verified before a byte is loaded.

:func:`load_vector` refuses a vector made for another model with one line naming the fields
that differ (geometry, config, weights, tokenizer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbridge.errors import ArtifactError
from kvbridge.prefix.pack_manifest import MODEL_REQUIRED

SCHEMA_VERSION = 1
KIND = "kvbridge.steering-vector"
TENSOR_FILE = "vector.safetensors"
REQUIRED = {
    "schema_version": int,
    "kind": str,
    "model": dict,
    "tokenizer": dict,
    "method": str,
    "position": dict,
    "key_space": str,
    "layers": list,
    "num_pairs": int,
    "norms": dict,
    "spec": dict,
    **MODEL_REQUIRED,
    "position.kind": str,
}


class VectorMismatchError(ArtifactError):
    """A steering vector was made for another model or tokenizer."""


def model_record(model, spec, *, weights_fp: str | None = None) -> dict:
    """The model fields of a pack's manifest (:func:`kvbridge.prefix.pack_manifest.model_record`), with
    the hidden size and dtype."""
    from kvbridge.prefix.pack_manifest import model_record as record

    return record(model, spec, weights_fp=weights_fp, hidden_size=spec.hidden_size, dtype=spec.dtype)


def build_manifest(vector, model, *, tokenizer_fp: dict | None = None, weights_fp: str | None = None) -> dict:
    from kvbridge.artifacts import library_versions

    info = dict(vector.info)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "model": model_record(model, vector.spec, weights_fp=weights_fp),
        "tokenizer": dict(tokenizer_fp or {"fingerprint": None, "source": "not recorded"}),
        "method": str(info.get("method", "mean")),
        "position": {"kind": str(info.get("position", "last"))},
        "key_space": vector.key_space,
        "layers": list(range(vector.num_layers)),
        "num_pairs": int(info.get("num_pairs", 0)),
        "pairs_sha256": info.get("pairs_sha256"),
        "template": info.get("template"),
        "transferred_from": info.get("transferred_from"),
        "has_residual": bool(vector.residual),
        "norms": vector.norms(),
        "spec": vector.spec.to_dict(),
        **library_versions(),
    }


def save_vector(
    vector,
    out: str | Path,
    model,
    *,
    tokenizer_fp: dict | None = None,
    weights_fp: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the vector folder atomically (the model is the one the directions belong to)."""
    from kvbridge.artifacts import write_artifact

    vector.validate()
    manifest = build_manifest(vector, model, tokenizer_fp=tokenizer_fp, weights_fp=weights_fp)
    groups = {"keys": vector.keys, "values": vector.values, "residual": vector.residual}
    tensors = {f"{name}.{i}": t.contiguous() for name, group in groups.items() for i, t in enumerate(group)}
    return write_artifact(out, tensors, manifest, tensor_file=TENSOR_FILE, overwrite=overwrite, kind=KIND)


def read_vector(path: str | Path):
    """``(manifest, SteeringVector)`` of a folder: checksum, manifest shape and tensor shapes checked."""
    from kvbridge.artifacts import check_kind, read_artifact
    from kvbridge.spec import ModelSpec
    from kvbridge.check.validate import finite_tensors, require_fields, tensors_match
    from kvbridge.steer.vectors import SteeringVector

    path = Path(path)
    where = str(path / "manifest.json")
    manifest, tensors = read_artifact(path, kind="steering vector")
    fix = "re-create it with kvbridge steer build"
    require_fields(manifest, REQUIRED, where, fix=fix)
    check_kind(manifest, KIND, SCHEMA_VERSION, path, "steering vector", "pass a steer build folder")
    try:
        spec = ModelSpec.from_dict(manifest["spec"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{where} field 'spec' is malformed ({exc})", fix) from None
    n, residual = spec.num_layers, bool(manifest.get("has_residual"))
    want = {f"keys.{i}": ("float32", (spec.kv_heads_of(i), spec.key_dim_of(i))) for i in range(n)}
    want |= {f"values.{i}": ("float32", (spec.kv_heads_of(i), spec.value_dim_of(i))) for i in range(n)}
    want |= {f"residual.{i}": ("float32", (spec.hidden_size,)) for i in range(n) if residual}
    tensors_match(tensors, want, str(path / TENSOR_FILE), fix=fix)
    finite_tensors(tensors, str(path / TENSOR_FILE), fix=fix)
    info = {k: manifest.get(k) for k in ("method", "num_pairs", "pairs_sha256", "template", "transferred_from")}
    info["position"] = manifest["position"]["kind"]
    info["model"] = manifest["model"]
    group = lambda name: tuple(tensors[f"{name}.{i}"] for i in range(n))  # noqa: E731
    return manifest, SteeringVector(
        group("keys"), group("values"), group("residual") if residual else (), spec, manifest["key_space"], info
    )


def mismatches(
    manifest: dict, model, *, tokenizer_fp: dict | None = None, weights_fp: str | None = None, host=None
) -> list[str]:
    """Every field in which the vector and ``model`` (+ tokenizer) disagree, most specific first."""
    from kvbridge.plugins import adapter_of

    spec = adapter_of(model, host).spec_of(model)
    m, now = manifest["model"], model_record(model, spec, weights_fp=weights_fp)  # what a save would record
    out = []
    have, want = ([r[k] for k in ("model_type", "num_layers", "num_kv_heads", "head_dim")] for r in (m, now))
    if have != want:
        out.append(
            f"geometry (vector {have[0]} {have[1]} layers x {have[2]} kv heads x {have[3]} vs model "
            f"{want[0]} {want[1]} x {want[2]} x {want[3]})"
        )
    for what in ("config", "weights"):
        key = f"{what}_fingerprint"
        if m[key] != now[key]:
            out.append(f"{what} (vector {m[key][:12]}... vs model {now[key][:12]}...)")
    have_tok = (manifest.get("tokenizer") or {}).get("fingerprint")
    now_tok = (tokenizer_fp or {}).get("fingerprint")
    if now_tok and have_tok and have_tok != now_tok:
        out.append(f"tokenizer (vector {have_tok[:12]}... vs {now_tok[:12]}...)")
    return out


def load_vector(
    path: str | Path, model: Any = None, *, tokenizer_fp: dict | None = None, weights_fp: str | None = None, host=None
):
    """The :class:`~kvbridge.steer.vectors.SteeringVector` of a folder, refused (one line) when
    ``model`` is not the model it was made for."""
    manifest, vector = read_vector(path)
    if model is not None:
        bad = mismatches(manifest, model, tokenizer_fp=tokenizer_fp, weights_fp=weights_fp, host=host)
        if bad:
            raise VectorMismatchError(
                f"steering vector {path} was made for another model ({manifest['model'].get('id')}): " + "; ".join(bad),
                "build a vector on this model (kvbridge steer build) or move this one through a fitted mapping "
                "(kvbridge steer transfer)",
            )
    return vector
