"""Mapping artifacts: a folder with ``mapping.safetensors`` and ``manifest.json``.

The manifest (JSON Schema: ``kvbridge/manifests/schemas/mapping.schema.json``, package data) records what the
mapping is for and how it was made: schema version; kvbridge, transformers and torch
versions; source and target specs with their fingerprints (spec hash, config hash, weights
hash, revision where known) and RoPE configuration; the tokenizer fingerprint; the fitter
and its parameters; the layer selection; held-out R² per (target layer, head, K/V); the
calibration corpus sha256, token and observation counts; the tensor dtype; and the sha256 of
the tensor file. It is written atomically (temp folder + rename, :mod:`kvbridge.artifacts`).

:func:`load_mapping` verifies the tensor checksum before reading a byte of it and, given the
models (or configs) it will be used with, refuses a pair whose fingerprints differ, naming
the field (``source.weights_fingerprint`` ...). ``force=True`` (``--accept-fingerprint-mismatch``) downgrades the
refusal to a warning.
"""

from __future__ import annotations

import datetime as _dt
import json
import warnings
from pathlib import Path
from typing import Any, Mapping

from kvbridge.errors import ArtifactError

SCHEMA_VERSION = 1
KIND = "kvbridge-mapping"
TENSOR_FILE = "mapping.safetensors"
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "manifests" / "schemas" / "mapping.schema.json"


class MappingMismatchWarning(UserWarning):
    """A mapping is used with models it was not fitted for (``force=True``)."""


# -- model identity --------------------------------------------------------------------------------------
def model_identity(
    model_or_config: Any, *, host=None, name: str = "", revision: str | None = None, weights: bool = True
) -> dict:
    """Spec, fingerprints and RoPE configuration of a model (or a config mapping: no weights hash)."""
    from kvbridge.models.fingerprint import config_fingerprint, weights_fingerprint
    from kvbridge.plugins import host_or_default

    host = host_or_default(host)
    is_model = hasattr(model_or_config, "parameters")
    config = model_or_config.config.to_dict() if is_model else dict(model_or_config)
    adapter = host.adapter_for(config)
    spec = adapter.spec_of(model_or_config) if is_model else adapter.describe(config)
    return {
        "name": name or str(config.get("_name_or_path") or ""),
        "revision": revision or config.get("_commit_hash") or None,
        "model_type": spec.model_type,
        "spec": spec.to_dict(),
        "spec_fingerprint": spec.fingerprint(),
        "config_fingerprint": config_fingerprint(config),
        "weights_fingerprint": weights_fingerprint(model_or_config) if (is_model and weights) else None,
        "dtype": spec.dtype,
        "rope": rope_config(spec),
    }


def as_identity(obj: Any, host=None) -> dict | None:
    """``obj`` as a :func:`model_identity` dict: None stays None, an identity dict is kept, a model or
    config is identified (its weights hashed)."""
    if obj is None or (isinstance(obj, Mapping) and "spec_fingerprint" in obj):
        return None if obj is None else dict(obj)
    return model_identity(obj, host=host)


def manifest_specs(manifest: Mapping, error) -> tuple:
    """The source and target :class:`~kvbridge.spec.ModelSpec` a manifest records; ``error(exc)``
    the exception to raise when one is missing or invalid."""
    from kvbridge.spec import ModelSpec

    try:
        return tuple(ModelSpec.from_dict(manifest[role]["spec"]) for role in ("source", "target"))
    except (KeyError, TypeError, ValueError) as exc:
        raise error(exc) from None


def rope_config(spec) -> dict | None:
    if spec.positional != "rope":
        return {"positional": spec.positional}
    out = {"positional": "rope", "default": spec.rope.to_dict() if spec.rope else None}
    if spec.rope_by_layer_type:
        out["by_layer_type"] = {k: v.to_dict() for k, v in spec.rope_by_layer_type}
    return out


def build_manifest(
    mapping, *, source: dict, target: dict, tokenizer: dict | None = None, calibration: dict | None = None
) -> dict:
    """The manifest of a fitted mapping (``source`` / ``target`` from :func:`model_identity`)."""
    from kvbridge.artifacts import library_versions

    rep = mapping.report.to_dict() if hasattr(mapping.report, "to_dict") else dict(mapping.report or {})
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        **library_versions(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "source": source,
        "target": target,
        "tokenizer": tokenizer,
        "fitter": {"name": mapping.fitter, "params": rep.get("params", {})},
        "mode": mapping.mode,
        "layer_selection": mapping.layer_selection(),
        "selection_scores": rep.get("selection_scores"),
        "heldout_r2": rep.get("heldout_r2", {"k": None, "v": None}),
        "r2_summary": rep.get("r2_summary", {}),
        "alpha_chosen": rep.get("alpha_chosen"),
        "warnings": list(rep.get("warnings", [])),
        "calibration": calibration or {},
        "observations": rep.get("observations", {}),
        "dtype": "float32",
        "compute_dtype": "float32",
        "exact": False,
        **({"training": rep["training"]} if rep.get("training") else {}),
        **(mapping.manifest_fields() if hasattr(mapping, "manifest_fields") else {}),
    }


def save_mapping(mapping, out: Path | str, *, manifest: dict | None = None, force: bool = False) -> Path:
    """Write ``mapping`` (its ``manifest`` unless one is given) atomically to the folder ``out``."""
    from kvbridge.artifacts import write_artifact

    manifest = dict(manifest or mapping.manifest or {})
    if not manifest:
        raise ArtifactError("mapping has no manifest", "build one with kvbridge.fit.artifact.build_manifest")
    validate(manifest, partial=True)
    return write_artifact(out, mapping.tensors(), manifest, tensor_file=TENSOR_FILE, overwrite=force, kind=KIND)


# -- loading ----------------------------------------------------------------------------------------------
CHECKED_FIELDS = ("spec_fingerprint", "config_fingerprint", "weights_fingerprint")
#: the words of a refused field per role: (how the mapping was fitted, the models at hand, what to fit for)
_REFUSAL = {
    "source": ("for a different source model", "for the given model", "this pair (kvbridge fit)"),
    "target": ("for a different target model", "for the given model", "this pair (kvbridge fit)"),
    "tokenizer": ("with a different tokenizer", "for the given models", "this tokenizer"),
}


def compared(manifest: Mapping, source: dict | None, target: dict | None, *, loaded_configs_only: bool = False):
    """``(role, field, recorded, given)`` of each fingerprint both ``manifest`` and the identity of the
    model at hand have (``loaded_configs_only``: a config fingerprint only when the weights are given
    too; a config read from files and one read from a loaded model normalise differently)."""
    for role, ident in (("source", source), ("target", target)):
        want = manifest.get(role) or {}
        for name in CHECKED_FIELDS if ident is not None else ():
            have, need = ident.get(name), want.get(name)
            skip = loaded_configs_only and name == "config_fingerprint" and ident.get("weights_fingerprint") is None
            if not skip and have is not None and need is not None:
                yield role, name, need, have


def verify_pair(
    manifest: Mapping,
    *,
    source: dict | None = None,
    target: dict | None = None,
    tokenizer: dict | None = None,
    force: bool = False,
) -> list[str]:
    """Compare a manifest with the identities of the models at hand; return the fields checked."""
    checks = list(compared(manifest, source, target))
    digests = ((manifest.get("tokenizer") or {}).get("digest"), (tokenizer or {}).get("digest"))
    if all(digests):
        checks.append(("tokenizer", "digest", *digests))
    for role, name, need, have in checks:
        if have == need:
            continue
        how, given, fix = _REFUSAL[role]
        msg = f"mapping was fitted {how}: field {role}.{name} is {need[:12]}... in the manifest, {have[:12]}... {given}"
        if not force:
            raise ArtifactError(msg, f"fit a mapping for {fix} or pass --accept-fingerprint-mismatch to use it anyway")
        warnings.warn(f"{msg} (used anyway: --accept-fingerprint-mismatch)", MappingMismatchWarning, stacklevel=2)
    return [f"{role}.{name}" for role, name, *_ in checks]


def load_mapping(
    folder: Path | str,
    *,
    source: Any = None,
    target: Any = None,
    tokenizer: dict | None = None,
    force: bool = False,
    host=None,
):
    """A :class:`~kvbridge.fit.mapping.FittedMapping` from an artifact folder.

    ``source`` / ``target``: the models (weights hashed) or config mappings it will be used
    with, or identity dicts from :func:`model_identity`; each fingerprint that differs from the
    manifest is refused naming the field (a warning with ``force=True``).
    """
    from kvbridge.artifacts import check_kind, read_artifact
    from kvbridge.check.validate import tensors_match
    from kvbridge.fit.mapping import FittedMapping
    from kvbridge.fit.protocol import FitReport

    manifest, tensors = read_artifact(folder, kind="mapping")
    where = Path(folder) / "manifest.json"
    check_kind(manifest, KIND, SCHEMA_VERSION, where, "kvbridge mapping", "pass a folder written by `kvbridge fit`")
    validate(manifest)
    # the checksum says the file is the one the manifest names; this says they agree (dtype of every
    # tensor; shapes are checked against the specs by FittedMapping.from_tensors)
    tensors_match(
        tensors,
        {name: (manifest.get("dtype", "float32"), None) for name in tensors},
        str(Path(folder) / TENSOR_FILE),
        fix="re-create the mapping with `kvbridge fit`",
    )
    idents = {"source": as_identity(source, host), "target": as_identity(target, host)}
    verify_pair(manifest, source=idents["source"], target=idents["target"], tokenizer=tokenizer, force=force)
    source_spec, target_spec = manifest_specs(
        manifest, lambda exc: ArtifactError(f"mapping manifest has an invalid spec ({exc})", "re-create the mapping")
    )
    if idents["target"] is not None:  # the target dtype of the model at hand decides the output dtype
        target_spec = target_spec.with_dtype(idents["target"]["dtype"])
    fitter = {"fitter": manifest["fitter"]["name"], "params": manifest["fitter"].get("params") or {}}
    report = FitReport.from_dict({**manifest, **fitter})  # the report's fields the manifest records
    mode = manifest.get("mode", "dense")
    residual = manifest.get("residual")
    if (mode == "dense+residual") != (residual is not None):
        raise ArtifactError(
            f"manifest mode {mode!r} and field residual disagree", "re-create the mapping with `kvbridge fit`"
        )
    mapping = FittedMapping.from_tensors(
        tensors,
        source_spec=source_spec,
        target_spec=target_spec,
        mode="dense" if residual is not None else mode,
        selection=manifest["layer_selection"],
        fitter=manifest["fitter"]["name"],
        report=report,
        manifest=manifest,
    )
    if residual is not None:  # a trained residual on the ridge map (fitter translator)
        from kvbridge.fit.translator_mapping import with_residual

        mapping = with_residual(mapping, tensors, residual)
    return mapping


# -- schema (a small JSON Schema subset: type, required, properties, items, enum, minimum, const) ----------
#: used only if the package data is missing (a broken install)
_FALLBACK_SCHEMA = {
    "type": "object",
    "required": [
        "schema_version",
        "kind",
        "source",
        "target",
        "fitter",
        "mode",
        "layer_selection",
        "tensor_file",
        "tensor_sha256",
    ],
}


def schema() -> dict:
    if not SCHEMA_PATH.is_file():
        return dict(_FALLBACK_SCHEMA)
    return json.loads(SCHEMA_PATH.read_text())


_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def _check(value: Any, sch: Mapping, where: str, root: Mapping | None = None) -> None:
    root = sch if root is None else root
    ref = sch.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        sch = {**target, **{k: v for k, v in sch.items() if k != "$ref"}}
    types = sch.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        ok = any(
            isinstance(value, _TYPES[t]) and not (t in ("integer", "number") and isinstance(value, bool)) for t in names
        )
        if not ok:
            raise ArtifactError(
                f"manifest field {where or '(root)'} should be {' or '.join(names)}, got {type(value).__name__}",
                "re-create the mapping with `kvbridge fit`",
            )

    def bad(want: str) -> ArtifactError:
        return ArtifactError(f"manifest field {where} must be {want}, got {value!r}", "re-create the mapping")

    if "const" in sch and value != sch["const"]:
        raise bad(repr(sch["const"]))
    if "enum" in sch and value not in sch["enum"]:
        raise bad(f"one of {sch['enum']}")
    if "minimum" in sch and isinstance(value, (int, float)) and value < sch["minimum"]:
        raise bad(f">= {sch['minimum']}")
    if isinstance(value, dict):
        for name in sch.get("required", []):
            if name not in value:
                raise ArtifactError(
                    f"manifest is missing field {(where + '.' if where else '') + name}",
                    "re-create the mapping with `kvbridge fit`",
                )
        for name, sub in (sch.get("properties") or {}).items():
            if name in value:
                _check(value[name], sub, f"{where}.{name}" if where else name, root)
    if isinstance(value, list) and isinstance(sch.get("items"), Mapping):
        for i, item in enumerate(value):
            _check(item, sch["items"], f"{where}[{i}]", root)


def validate(manifest: Mapping, *, partial: bool = False) -> None:
    """Check ``manifest`` against the schema (``partial``: before the tensor checksum is added)."""
    sch = dict(schema())
    if partial:
        sch["required"] = [r for r in sch.get("required", []) if r not in ("tensor_file", "tensor_sha256")]
    _check(dict(manifest), sch, "")
