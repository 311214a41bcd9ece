"""Prefix packs: a guide's KV cache prefilled once, saved, and restored with zero forward passes.

A pack is a folder with ``kv.safetensors`` (the per-layer K/V of the guide tokens, their ids and
positions; never pickle) and ``manifest.json`` (schema ``manifests/schemas/prefix-pack.schema.json``)
that versions the state against everything that decides what the tensors mean:

- the model: id, revision where known, config fingerprint, weights fingerprint, geometry,
- the tokenizer fingerprint and the exact guide token ids (with the guide text),
- positions (a pack is a *prefix*: positions ``0 .. n-1``),
- transformers / torch / kvbridge versions, the cache format (class, layout, layer kinds,
  whether keys carry RoPE), dtype, and the positional / RoPE configuration,
- the sha256 of the tensor file (checked before a byte of it is loaded).

:func:`load_pack` restores the :class:`~kvbridge.kvstate.KVState` from the stored tensors and
:meth:`Pack.cache` injects it into a fresh ``DynamicCache``: no forward pass runs (the tests
count them with a forward pre-hook). A pack is refused, naming the field, when the model,
weights, tokenizer, guide ids, dtype, RoPE configuration or cache format differ. ``force=True``
loads anyway, with a loud warning, where that is meaningful (weights, config, tokenizer, guide
ids, dtype); a different geometry, RoPE table or cache format is never forced, and a corrupt or
truncated tensor file is always refused by its checksum.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from kvbridge import __version__
from kvbridge.errors import ArtifactError, ConfigError, KVBridgeError

SCHEMA_VERSION = 1
PACK_KIND = "kvbridge.prefix-pack"
TENSOR_FILE = "kv.safetensors"
#: fields that ``force=True`` may override (the state still has the right shape and meaning)
FORCEABLE = frozenset({"config", "weights", "tokenizer", "guide_token_ids", "dtype"})
#: manifest keys every pack has, with their JSON types (the schema file says the same)
REQUIRED = {
    "schema_version": int, "kind": str, "model": dict, "tokenizer": dict, "guide": dict,
    "positions": dict, "dtype": str, "cache_format": dict, "positional": dict,
    "transformers_version": str, "torch_version": str, "kvbridge_version": str, "state": dict,
    "tensor_file": str, "tensor_sha256": str,
}


#: nested fields the readers use (checked by kvbridge.check.validate.require_fields)
NESTED_REQUIRED = {
    "model.model_type": str, "model.num_layers": int, "model.num_kv_heads": int, "model.head_dim": int,
    "model.config_fingerprint": str, "model.weights_fingerprint": str, "model.spec_fingerprint": str,
    "guide.token_ids": list, "guide.num_tokens": int, "positions.start": int, "positions.stop": int,
    "positional.kind": str, "cache_format.cache_class": str, "cache_format.layout": str,
    "state.num_layers": int, "state.spec": dict,
}


class PackMismatchError(ArtifactError):
    """A pack was made for a different model, tokenizer, dtype, RoPE table or cache format."""

    def __init__(self, what: str, fix: str | None = None, fields: tuple = ()):
        self.fields = tuple(fields)
        super().__init__(what, fix)


class PackForceWarning(UserWarning):
    """A pack was loaded with ``force=True`` although fields differ."""


# -- identities -----------------------------------------------------------------------------------
def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


# the model id / revision and the tokenizer fingerprint live in kvbridge.models.fingerprint
from kvbridge.models.fingerprint import model_id_revision as model_identity  # noqa: E402,F401
from kvbridge.models.fingerprint import tokenizer_identity as tokenizer_fingerprint  # noqa: E402,F401


def cache_format(spec) -> dict:
    """How the cache this spec's model builds is laid out (what the pack's tensors assume)."""
    from kvbridge.check.spec import SLIDING

    kinds = [spec.layer_type(i) for i in range(spec.num_layers)]
    return {
        "cache_class": "DynamicCache",
        "layout": "batch,kv_heads,tokens,head_dim",
        "keys": "post_rope" if spec.positional == "rope" else "no_rotation",
        "layer_kinds": kinds,
        "layer_classes": ["DynamicSlidingWindowLayer" if k == SLIDING else "DynamicLayer" for k in kinds],
        "stored_history": "full",  # sliding layers keep every token here; injection trims
        "num_layers": spec.num_layers,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "sliding_window": spec.sliding_window if SLIDING in kinds else None,
    }


def positional_config(spec) -> dict:
    return {
        "kind": spec.positional,
        "rope": spec.rope.to_dict() if spec.rope else None,
        "rope_by_layer_type": {k: v.to_dict() for k, v in spec.rope_by_layer_type},
        "max_position_embeddings": spec.max_position_embeddings,
    }


def _versions() -> dict:
    import torch
    import transformers

    return {"transformers_version": transformers.__version__,
            "torch_version": str(torch.__version__), "kvbridge_version": __version__}


def _adapter(model, host=None):
    from kvbridge.plugins import get_host

    return (host or get_host()).adapter_for(model.config.to_dict())


# -- saving ---------------------------------------------------------------------------------------
def guide_ids_of(tokenizer: Any, text: str) -> list[int]:
    """The ghost ids of a guide text: encoded with the tokenizer's leading special tokens (BOS)."""
    from kvbridge.prefix.splits import SplitError, _strip_suffix, encode, special_affixes

    if not text or not text.strip():
        raise SplitError("the guide is empty", "pass a non-empty --guide TEXT (or @FILE)")
    _prefix, suffix = special_affixes(tokenizer)
    return _strip_suffix(encode(tokenizer, text, add_special_tokens=True), suffix)


def check_guide_length(n: int, spec, *, extra: int = 1, what: str = "guide") -> None:
    """Refuse ``n`` guide tokens when the model has no room for them plus ``extra`` more."""
    limit = int(spec.max_position_embeddings or 0)
    if n <= 0:
        raise KVBridgeError(f"the {what} has no tokens", "pass a non-empty guide")
    if limit and n + extra > limit:
        raise KVBridgeError(
            f"the {what} has {n} tokens (+{extra} to follow) but the model has {limit} positions",
            "shorten the guide or use a model with more positions")


def build_manifest(model, state, *, guide_text: str | None, tokenizer_fp: dict, model_dir=None,
                   weights_fp: str | None = None, special_prefix=()) -> dict:
    from kvbridge.models.fingerprint import config_fingerprint, weights_fingerprint
    from kvbridge.artifacts import state_manifest

    spec = state.spec
    ids = [int(x) for x in state.token_ids[0].tolist()]
    ident = model_identity(model, model_dir)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": PACK_KIND,
        "model": {
            "id": ident["id"], "revision": ident["revision"], "model_type": spec.model_type,
            "family": spec.family, "config_fingerprint": config_fingerprint(model.config.to_dict()),
            "weights_fingerprint": weights_fp or weights_fingerprint(model),
            "spec_fingerprint": spec.fingerprint(), "num_layers": spec.num_layers,
            "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
            "max_position_embeddings": spec.max_position_embeddings,
        },
        "tokenizer": dict(tokenizer_fp),
        "guide": {"text": guide_text, "token_ids": ids, "num_tokens": len(ids),
                  "special_prefix": [int(x) for x in special_prefix], "ids_sha256": _sha(ids)},
        "positions": {"start": 0, "stop": len(ids), "kind": "prefix"},
        "dtype": str(state.dtype).removeprefix("torch."),
        "cache_format": cache_format(spec),
        "positional": positional_config(spec),
        **_versions(),
        "state": state_manifest(state),
    }


def save_pack(model, out: str | Path, *, guide_text: str | None = None, guide_ids=None, tokenizer: Any = None,
              model_dir: str | Path | None = None, tokenizer_fp: dict | None = None,
              weights_fp: str | None = None, overwrite: bool = False, host=None) -> Path:
    """Prefill the guide once with the model's adapter and write the pack folder atomically.

    Give ``guide_text`` with a ``tokenizer`` (ids = the ghost encoding, with BOS) or exact
    ``guide_ids``. Nothing is written when anything is wrong.
    """
    import torch

    from kvbridge.artifacts import state_tensors, write_artifact
    from kvbridge.prefix.splits import special_affixes

    from kvbridge.artifacts import check_replaceable

    out = Path(out)
    check_replaceable(out, PACK_KIND, overwrite=overwrite)  # before the prefill: refuse early
    if guide_ids is None:
        if tokenizer is None or guide_text is None:
            raise KVBridgeError("save_pack needs guide_ids, or guide_text with a tokenizer",
                                "pass the guide text and the model's tokenizer")
        guide_ids = guide_ids_of(tokenizer, guide_text)
    ids = torch.as_tensor(list(guide_ids), dtype=torch.long)[None]
    adapter = _adapter(model, host)
    spec = adapter.spec_of(model)
    check_guide_length(int(ids.shape[1]), spec)
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab and int(ids.max()) >= vocab:
        raise KVBridgeError(f"guide token id {int(ids.max())} is outside the model's vocabulary ({vocab} ids)",
                            "use the model's own tokenizer")
    if tokenizer_fp is None:
        tokenizer_fp = tokenizer_fingerprint(tokenizer, folder=model_dir)
    state = adapter.extract(model, ids, spec=spec)
    special = special_affixes(tokenizer)[0] if tokenizer is not None else ()
    manifest = build_manifest(model, state, guide_text=guide_text, tokenizer_fp=tokenizer_fp,
                              model_dir=model_dir, weights_fp=weights_fp, special_prefix=special)
    return write_artifact(out, state_tensors(state), manifest, tensor_file=TENSOR_FILE, overwrite=overwrite,
                          kind=PACK_KIND)


# -- reading and checking -------------------------------------------------------------------------
def check_manifest_shape(manifest: Mapping, where: str = "pack manifest") -> None:
    """Minimal schema check: required keys present with the right JSON types (see the schema file)."""
    for key, typ in REQUIRED.items():
        if key not in manifest:
            raise ArtifactError(f"{where} is missing {key!r}", "re-create the pack with kvbridge pack save")
        if not isinstance(manifest[key], typ) or (typ is int and isinstance(manifest[key], bool)):
            raise ArtifactError(f"{where} field {key!r} must be {typ.__name__}, got {type(manifest[key]).__name__}",
                                "re-create the pack with kvbridge pack save")
    if manifest["kind"] != PACK_KIND:
        raise ArtifactError(f"{where} kind is {manifest['kind']!r}, not {PACK_KIND!r}", "pass a prefix pack folder")
    from kvbridge.check.validate import require_fields

    require_fields(manifest, NESTED_REQUIRED, where, fix="re-create the pack with kvbridge pack save")
    if manifest["schema_version"] > SCHEMA_VERSION:
        raise ArtifactError(f"pack schema_version {manifest['schema_version']} is newer than this kvbridge "
                            f"supports ({SCHEMA_VERSION})", "upgrade kvbridge")
    guide = manifest["guide"]
    if not isinstance(guide.get("token_ids"), list) or not guide["token_ids"]:
        raise ArtifactError(f"{where} has no guide token ids", "re-create the pack")
    for key in ("config_fingerprint", "weights_fingerprint", "model_type"):
        if not isinstance(manifest["model"].get(key), str):
            raise ArtifactError(f"{where} model.{key} is missing", "re-create the pack")


@dataclass(frozen=True)
class Mismatch:
    field: str  # model, config, weights, tokenizer, guide_token_ids, dtype, rope, cache_format
    pack: Any
    model: Any
    forceable: bool

    def describe(self) -> str:
        def short(v: Any) -> str:
            s = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
            return s[:12] + "..." if isinstance(v, str) and len(v) == 64 else (s if len(s) <= 60 else s[:57] + "...")
        return f"{self.field} differs (pack {short(self.pack)} vs model {short(self.model)})"


def _diff_dict(a: Mapping, b: Mapping) -> tuple[dict, dict]:
    keys = sorted(set(a) | set(b))
    da = {k: a.get(k) for k in keys if a.get(k) != b.get(k)}
    db = {k: b.get(k) for k in keys if a.get(k) != b.get(k)}
    return da, db


def compare(manifest: Mapping, model, *, tokenizer_fp: dict | None = None, weights_fp: str | None = None,
            guide_ids_now: list | None = None, check_weights: bool = True, host=None) -> list[Mismatch]:
    """Every field in which the pack and ``model`` (+ tokenizer) disagree, most specific first."""
    from kvbridge.models.fingerprint import config_fingerprint, weights_fingerprint

    spec = _adapter(model, host).spec_of(model)
    out: list[Mismatch] = []
    m = manifest["model"]
    geometry_pack = {k: m.get(k) for k in ("model_type", "num_layers", "num_kv_heads", "head_dim")}
    geometry_model = {"model_type": spec.model_type, "num_layers": spec.num_layers,
                      "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim}
    if geometry_pack != geometry_model:
        a, b = _diff_dict(geometry_pack, geometry_model)
        out.append(Mismatch("model", a, b, False))
    pos_pack, pos_model = manifest["positional"], positional_config(spec)
    if pos_pack != pos_model:
        a, b = _diff_dict(pos_pack, pos_model)
        out.append(Mismatch("rope", a, b, False))
    cf_pack, cf_model = manifest["cache_format"], cache_format(spec)
    if cf_pack != cf_model:
        a, b = _diff_dict(cf_pack, cf_model)
        out.append(Mismatch("cache_format", a, b, False))
    if manifest["dtype"] != spec.dtype:
        out.append(Mismatch("dtype", manifest["dtype"], spec.dtype, True))
    cfg = config_fingerprint(model.config.to_dict())
    if m["config_fingerprint"] != cfg:
        out.append(Mismatch("config", m["config_fingerprint"], cfg, True))
    if check_weights:
        wfp = weights_fp or weights_fingerprint(model)
        if m["weights_fingerprint"] != wfp:
            out.append(Mismatch("weights", m["weights_fingerprint"], wfp, True))
    if tokenizer_fp is not None and tokenizer_fp.get("fingerprint"):
        have = manifest["tokenizer"].get("fingerprint")
        if have != tokenizer_fp["fingerprint"]:
            out.append(Mismatch("tokenizer", have, tokenizer_fp["fingerprint"], True))
    if guide_ids_now is not None and list(guide_ids_now) != list(manifest["guide"]["token_ids"]):
        out.append(Mismatch("guide_token_ids", f"{manifest['guide']['num_tokens']} ids",
                            f"{len(guide_ids_now)} ids now", True))
    return out


@dataclass(frozen=True)
class Pack:
    """A loaded pack: the manifest and the restored state (no forward pass was run)."""

    path: Path | None
    manifest: dict
    state: Any  # KVState
    mismatches: tuple = ()  # fields that differed and were forced
    forced: bool = False
    notes: tuple = field(default=(), compare=False)

    @property
    def guide_ids(self) -> list[int]:
        return list(self.manifest["guide"]["token_ids"])

    @property
    def guide_text(self) -> str | None:
        return self.manifest["guide"].get("text")

    @property
    def num_tokens(self) -> int:
        return len(self.guide_ids)

    def state_for(self, model):
        """The restored state on the model's device."""
        device = next(model.parameters()).device
        return self.state if self.state.device == device else self.state.to(device=device)

    def cache(self, model, host=None):
        """A fresh ``DynamicCache`` holding the guide (the adapter's inject; no forward pass)."""
        return _adapter(model, host).inject(self.state_for(model), model)

    def split_for(self, tokenizer: Any, live: str, sep: str = " "):
        """The exact split of ``guide + sep + live`` whose ghost is this pack (or a SplitError)."""
        from kvbridge.prefix.splits import SplitError, split_text

        if self.guide_text is None:
            raise SplitError("this pack stores no guide text", "encode the live part yourself and check the ids")
        report = split_text(tokenizer, self.guide_text, live, sep)
        split = report.require_safe()
        if list(split.ghost) != self.guide_ids:
            raise SplitError(
                f"the exact split's ghost ({len(split.ghost)} tokens, boundary at char {split.boundary}) is not the "
                f"pack's guide ({self.num_tokens} tokens): the guide's last token merges with the live text",
                "save the pack from the safe split's ghost text (kvbridge split) or change the separator")
        return report, split

    def generate(self, model, input_ids, host=None, **kwargs):
        """``model.generate`` continuing from the pack (the hand-off withholds the last prompt token)."""
        from kvbridge.handoff import generate

        return generate(model, self.state_for(model), input_ids, host=host, **kwargs)


def read_pack(path: str | Path):
    """``(manifest, tensors)`` of a pack folder: checksum verified, manifest shape checked."""
    from kvbridge.artifacts import read_artifact

    manifest, tensors = read_artifact(path, kind="prefix pack")
    check_manifest_shape(manifest, f"{Path(path) / 'manifest.json'}")
    from kvbridge.check.validate import tensors_match

    m, n = manifest["model"], manifest["guide"]["num_tokens"]
    kv = (None, m["num_kv_heads"], None, None)  # [batch, kv heads, tokens (sliding layers keep fewer), dim]
    want = {f"layers.{i}.{x}": (manifest["dtype"], kv) for i in range(m["num_layers"]) for x in ("keys", "values")}
    want["token_ids"] = (("int64", "int32"), (None, n))
    tensors_match(tensors, want, str(Path(path) / TENSOR_FILE), allow_extra=True,
                  fix="re-create the pack with kvbridge pack save")
    return manifest, tensors


def _refusal(path, mismatches: list[Mismatch], forced_ok: bool) -> PackMismatchError:
    fields = tuple(x.field for x in mismatches)
    what = f"pack {path} does not match the model: " + "; ".join(x.describe() for x in mismatches)
    if forced_ok:
        fix = "re-create the pack with this model and tokenizer (kvbridge pack save), or pass --force to load it anyway"
    else:
        hard = [x.field for x in mismatches if not x.forceable]
        fix = (f"re-create the pack with this model (kvbridge pack save); {', '.join(hard)} cannot be forced: "
               "the stored tensors have another shape or meaning")
    return PackMismatchError(what, fix, fields)


def load_pack(path: str | Path, model, *, tokenizer: Any = None, tokenizer_dir: str | Path | None = None,
              tokenizer_fp: dict | None = None, weights_fp: str | None = None, check_weights: bool = True,
              force: bool = False, host=None) -> Pack:
    """Restore a pack for ``model`` from its tensors (zero forward passes), refusing mismatches.

    The tokenizer is checked when given (a tokenizer object, its folder, or a precomputed
    :func:`tokenizer_fingerprint`): its fingerprint, and the guide text re-encoded to the stored
    ids. ``weights_fp`` skips re-hashing the weights when the caller has it already.
    """
    from kvbridge.artifacts import state_from_tensors

    path = Path(path)
    manifest, tensors = read_pack(path)
    if tokenizer_fp is None and (tokenizer is not None or tokenizer_dir is not None):
        tokenizer_fp = tokenizer_fingerprint(tokenizer, folder=tokenizer_dir)
    guide_now = None
    if tokenizer is not None and manifest["guide"].get("text"):
        try:
            guide_now = guide_ids_of(tokenizer, manifest["guide"]["text"])
        except KVBridgeError:
            guide_now = []
    mismatches = compare(manifest, model, tokenizer_fp=tokenizer_fp, weights_fp=weights_fp,
                         guide_ids_now=guide_now, check_weights=check_weights, host=host)
    hard = [x for x in mismatches if not x.forceable]
    if hard or (mismatches and not force):
        raise _refusal(path, mismatches, forced_ok=not hard)
    state = state_from_tensors(tensors, manifest["state"])
    ids = [int(x) for x in state.token_ids[0].tolist()]
    if ids != list(manifest["guide"]["token_ids"]):
        raise ArtifactError(f"pack {path}: stored token ids disagree with the manifest's guide ids",
                            "re-create the pack")
    notes: list[str] = []
    if mismatches:
        fields = ", ".join(x.field for x in mismatches)
        msg = (f"WARNING: pack {path} loaded with --force although {fields} differ: the restored cache is NOT the "
               "exact prefix state of this model and results are not comparable to a fresh prefill")
        warnings.warn(msg, PackForceWarning, stacklevel=2)
        notes.append(msg)
        spec = _adapter(model, host).spec_of(model)
        import torch

        if any(x.field == "dtype" for x in mismatches):
            state = state.to(dtype=getattr(torch, spec.dtype))
        state = replace(state, spec=spec, approximate=True, meta={**state.meta, "forced": fields})
    import transformers

    if manifest["transformers_version"] != transformers.__version__:
        notes.append(f"pack written with transformers {manifest['transformers_version']}, running "
                     f"{transformers.__version__} (cache format checked and equal)")
    return Pack(path=path, manifest=manifest, state=state, mismatches=tuple(mismatches), forced=bool(mismatches),
                notes=tuple(notes))


def recompute_check(pack: Pack, model, host=None) -> float:
    """Max abs difference between the stored K/V and a fresh prefill of the guide ids (a forward pass)."""
    import torch

    adapter = _adapter(model, host)
    fresh = adapter.extract(model, torch.as_tensor([pack.guide_ids]))
    worst = 0.0
    for a, b in zip((*pack.state.keys, *pack.state.values), (*fresh.keys, *fresh.values)):
        worst = max(worst, float((a.float() - b.float()).abs().max()))
    return worst


# -- model folders --------------------------------------------------------------------------------
def require_model_dir(path: str | Path) -> Path:
    """``path`` if it is a local model folder (has ``config.json``), else a one-line ConfigError."""
    path = Path(path)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ConfigError(f"{path} is not a local model folder (no config.json)",
                          "pass a folder written by save_pretrained")
    return path


def open_model_dir(path: str | Path, *, dtype: str | None = None):
    """A causal LM from a local model folder, through :func:`kvbridge.models.load` (its dtype policy)."""
    from kvbridge.models.loading import dtype_for, load_weights
    from kvbridge.models.resolve import resolve

    ref = resolve(str(require_model_dir(path)))
    return load_weights(ref, dtype_for(ref, dtype))


__all__ = ["Pack", "PackMismatchError", "PackForceWarning", "Mismatch", "save_pack", "load_pack", "read_pack",
           "compare", "build_manifest", "tokenizer_fingerprint", "model_identity", "cache_format",
           "positional_config", "check_manifest_shape", "open_model_dir", "require_model_dir", "guide_ids_of", "recompute_check",
           "SCHEMA_VERSION", "PACK_KIND", "TENSOR_FILE", "FORCEABLE"]
