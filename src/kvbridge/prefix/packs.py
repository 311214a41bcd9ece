"""Prefix packs: a guide's KV cache prefilled once, saved, and restored with zero forward passes.

A pack is a folder with ``kv.safetensors`` (the K/V of the guide tokens, stacked in one tensor when
every layer has one shape, else per layer; their ids and positions; never pickle) and ``manifest.json`` (schema ``manifests/schemas/prefix-pack.schema.json``)
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

The manifest (its fields, shape check and the comparison with a model) lives in
:mod:`kvbridge.prefix.pack_manifest`; its names are re-exported here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvbridge.artifacts import check_replaceable, read_artifact, write_artifact
from kvbridge.errors import ArtifactError, ConfigError, KVBridgeError
from kvbridge.models.fingerprint import weights_fingerprint
from kvbridge.plugins import adapter_of
from kvbridge.prefix.splits import SplitError, encode, special_affixes, split_text, strip_suffix
from kvbridge.prefix.pack_manifest import (
    FIX,
    FORCEABLE,
    NESTED_REQUIRED,
    PACK_KIND,
    PER_LAYER,
    REQUIRED,
    SCHEMA_VERSION,
    STACKED,
    TENSOR_FILE,
    Mismatch,
    build_manifest,
    cache_format,
    check_manifest_shape,
    compare,
    model_reference,
    positional_config,
    recorded_model,
    tokenizer_fingerprint,
)


class PackMismatchError(ArtifactError):
    """A pack was made for a different model, tokenizer, dtype, RoPE table or cache format."""

    def __init__(self, what: str, fix: str | None = None, fields: tuple = ()):
        self.fields = tuple(fields)
        super().__init__(what, fix)


class PackForceWarning(UserWarning):
    """A pack was loaded with ``force=True`` although fields differ."""


# -- saving ---------------------------------------------------------------------------------------
def guide_ids_of(tokenizer: Any, text: str) -> list[int]:
    """The ghost ids of a guide text: encoded with the tokenizer's leading special tokens (BOS)."""
    if not text or not text.strip():
        raise SplitError("the guide is empty", "pass a non-empty --guide TEXT (or @FILE)")
    _prefix, suffix = special_affixes(tokenizer)
    return strip_suffix(encode(tokenizer, text, add_special_tokens=True), suffix)


def check_guide_length(n: int, spec, *, extra: int = 1, what: str = "guide", total: int = 0, new: int = 0) -> None:
    """Refuse ``n`` guide tokens when the model has no room for them plus ``extra`` more, or a run of
    ``total`` tokens (guide + prompt + ``new`` generated) beyond the model's positions."""
    limit = int(spec.max_position_embeddings or 0)
    if n <= 0:
        raise KVBridgeError(f"the {what} has no tokens", "pass a non-empty guide")
    if limit and n + extra > limit:
        raise KVBridgeError(
            f"the {what} has {n} tokens (+{extra} to follow) but the model has {limit} positions",
            "shorten the guide or use a model with more positions",
        )
    if limit and total > limit:
        raise KVBridgeError(
            f"guide + prompt + {new} new tokens = {total} tokens exceed the model's {limit} positions",
            "shorten the guide or prompt, or lower --max-new-tokens",
        )


@dataclass(frozen=True)
class PackIdentity:
    """What a pack records about its model beyond the weights in memory: ``model_dir`` (the folder, for
    the tokenizer fingerprint and the manifest), ``tokenizer_fp`` / ``weights_fp`` (fingerprints already
    computed; None: computed here), ``reference`` (the model reference to record,
    :func:`model_reference`; ``kvbridge pack export`` defaults ``--model`` to it)."""

    model_dir: str | Path | None = None
    tokenizer_fp: dict | None = None
    weights_fp: str | None = None
    reference: str | None = None


def save_pack(
    model,
    out: str | Path,
    identity: PackIdentity | None = None,
    *,
    guide_text: str | None = None,
    guide_ids=None,
    tokenizer: Any = None,
    overwrite: bool = False,
    host=None,
    **fields: Any,
) -> Path:
    """Prefill the guide once with the model's adapter and write the pack folder atomically.

    Give ``guide_text`` with a ``tokenizer`` (ids = the ghost encoding, with BOS) or exact
    ``guide_ids``; ``identity`` (or its fields as keywords): :class:`PackIdentity`. Nothing is
    written when anything is wrong.
    """
    ident = identity if identity is not None else PackIdentity(**fields)
    import torch

    out = Path(out)
    check_replaceable(out, PACK_KIND, overwrite=overwrite)  # before the prefill: refuse early
    if guide_ids is None:
        if tokenizer is None or guide_text is None:
            raise KVBridgeError(
                "save_pack needs guide_ids, or guide_text with a tokenizer",
                "pass the guide text and the model's tokenizer",
            )
        guide_ids = guide_ids_of(tokenizer, guide_text)
    ids = torch.as_tensor(list(guide_ids), dtype=torch.long)[None]
    adapter = adapter_of(model, host)
    spec = adapter.spec_of(model)
    check_guide_length(int(ids.shape[1]), spec)
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab and int(ids.max()) >= vocab:
        raise KVBridgeError(
            f"guide token id {int(ids.max())} is outside the model's vocabulary ({vocab} ids)",
            "use the model's own tokenizer",
        )
    if ident.tokenizer_fp is None:
        ident = replace(ident, tokenizer_fp=tokenizer_fingerprint(tokenizer, folder=ident.model_dir))
    state = adapter.extract(model, ids, spec=spec)
    special = special_affixes(tokenizer)[0] if tokenizer is not None else ()
    return _write_pack(model, state, out, overwrite, ident, guide_text=guide_text, special_prefix=special)


def _write_pack(model, state, out: Path, overwrite: bool, ident: PackIdentity, provenance=None, **fields) -> Path:
    """Store ``state`` (:func:`pack_tensors`) with its manifest in the pack folder ``out``, atomically."""
    tensors, layout = pack_tensors(state)
    manifest = build_manifest(model, state, kv_layout=layout, **vars(ident), **fields)
    if provenance is not None:
        manifest["provenance"] = dict(provenance)
    return write_artifact(out, tensors, manifest, tensor_file=TENSOR_FILE, overwrite=overwrite, kind=PACK_KIND)


def save_state_pack(
    model,
    state,
    out: str | Path,
    *,
    tokenizer_fp: dict,
    provenance: dict,
    model_dir: str | Path | None = None,
    reference: str | None = None,
    overwrite: bool = False,
    host=None,
) -> Path:
    """Write a KV state already computed for ``model`` (a transferred or steered cache) as a pack
    folder, with no forward pass. ``provenance`` (``{"kind": "transferred", ...}``) is recorded in the
    manifest; the state keeps its ``approximate`` mark, so loading or exporting the pack never presents
    it as the model's own prefill. Refused in one line when the state's geometry is not the model's or
    it is not a prefix (positions ``0..T-1``) of one row."""
    out = Path(out)
    check_replaceable(out, PACK_KIND, overwrite=overwrite)
    spec = adapter_of(model, host).spec_of(model)
    got = (state.num_layers, state.spec.num_kv_heads, state.spec.head_dim)
    want = (spec.num_layers, spec.num_kv_heads, spec.head_dim)
    if got != want:
        raise ConfigError(
            f"the KV state caches {got[0]} layers x {got[1]} KV heads x {got[2]}, the model "
            f"{want[0]} x {want[1]} x {want[2]}",
            "save a state transferred to this model (kvbridge transfer --save-state)",
        )
    if state.batch_size != 1 or state.positions[0].tolist() != list(range(state.num_tokens)):
        raise ConfigError(
            "a pack holds one prefix at positions 0..T-1; this state does not", "save one row computed from the start"
        )
    if not isinstance(provenance, dict) or not isinstance(provenance.get("kind"), str):
        raise ConfigError("provenance must be a dict with a 'kind'", "pass e.g. {'kind': 'transferred'}")
    state = replace(state, spec=replace(spec, dtype=str(state.dtype).removeprefix("torch.")))
    ident = PackIdentity(model_dir, tokenizer_fp, reference=reference)
    return _write_pack(model, state, out, overwrite, ident, provenance, guide_text=None)


def origin_of(manifest: dict) -> str:
    """How a pack's cache was made, in words: ``prefilled by the model`` or what its provenance says,
    with ``approximate`` spelled out."""
    prov = manifest.get("provenance") or {}
    approximate = bool((manifest.get("state") or {}).get("approximate", False))
    if not prov and not approximate:
        return "the model's own prefill (exact)"
    what = prov.get("kind", "edited")
    detail = ", ".join(f"{k} {prov[k]}" for k in ("source", "mapping") if prov.get(k))
    return f"{what}{f' ({detail})' if detail else ''}" + (
        ": approximate, not the model's own exact cache" if approximate else ""
    )


def pack_tensors(state) -> tuple[dict, str]:
    """``(tensors, kv_layout)`` to store ``state``: K/V stacked into one tensor ``kv`` when every layer
    has one shape and dtype (a restore then parses and checks a few tensors, not two per layer),
    per layer otherwise (the layouts are described in :mod:`kvbridge.prefix.pack_manifest`)."""
    import torch

    from kvbridge.kvstate_io import state_tensors

    tensors = state_tensors(state)
    kv = (*state.keys, *state.values)
    if (
        not state.spec.uniform_kv
        or state.indexer_keys
        or len({(tuple(t.shape), t.dtype) for t in kv}) != 1
        or not kv[0].numel()
    ):
        return tensors, PER_LAYER
    out = {k: v for k, v in tensors.items() if not k.startswith("layers.")}
    out["kv"] = torch.stack([torch.stack(pair) for pair in zip(state.keys, state.values)])
    return out, STACKED


# -- reading and loading ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Pack:
    """A loaded pack: the manifest and the restored state (no forward pass was run)."""

    path: Path | None
    manifest: dict
    state: Any  # KVState
    mismatches: tuple = ()  # fields that differed and were forced
    forced: bool = False
    notes: tuple = field(default=(), compare=False)
    #: every stored K/V value was found finite when the pack was loaded (``cache`` skips that check)
    finite_checked: bool = field(default=False, compare=False)

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
        """A fresh ``DynamicCache`` holding the guide (the adapter's inject; no forward pass).

        The state is validated against ``model`` (shapes, dtype) first; its values were found
        finite when the pack was loaded, so that check is not repeated here.
        """
        adapter = adapter_of(model, host)
        state = self.state_for(model)
        if not self.finite_checked:
            return adapter.inject(state, model)
        import torch

        spec = adapter.spec_of(model)
        state.validate(spec, dtype=getattr(torch, spec.dtype), check_finite=False)
        return adapter.inject(state, model, check=False)

    def split_for(self, tokenizer: Any, live: str, sep: str = " "):
        """The exact split of ``guide + sep + live`` whose ghost is this pack (or a SplitError)."""
        if self.guide_text is None:
            raise SplitError("this pack stores no guide text", "encode the live part yourself and check the ids")
        report = split_text(tokenizer, self.guide_text, live, sep)
        split = report.require_safe()
        if list(split.ghost) != self.guide_ids:
            raise SplitError(
                f"the exact split's ghost ({len(split.ghost)} tokens, boundary at char {split.boundary}) is not the "
                f"pack's guide ({self.num_tokens} tokens): the guide's last token merges with the live text",
                "save the pack from the safe split's ghost text (kvbridge split) or change the separator",
            )
        return report, split

    def generate(self, model, input_ids, host=None, **kwargs):
        """``model.generate`` continuing from the pack (the hand-off withholds the last prompt token)."""
        from kvbridge.handoff import generate

        return generate(model, self.state_for(model), input_ids, host=host, **kwargs)


def read_pack(path: str | Path):
    """``(manifest, tensors)`` of a pack folder: checksum verified, manifest shape checked.

    The tensors carry per-layer names (``layers.{i}.keys`` ...) whatever the stored layout: a
    stacked pack's are views of its one ``kv`` tensor.
    """
    from kvbridge.kvstate_io import unstack

    manifest, tensors = _read_stored(path)
    return manifest, (unstack(tensors) if manifest.get("kv_layout") == STACKED else tensors)


def read_pack_state(path: str | Path):
    """``(manifest, KVState)`` of a pack folder without a model (what an engine export writes): checksum
    verified; the state keeps its ``approximate`` mark and, in ``meta["provenance"]``, the pack's
    provenance record (a transferred or steered cache)."""
    from kvbridge.kvstate_io import state_from_tensors

    manifest, tensors = read_pack(path)
    state = state_from_tensors(tensors, manifest["state"])
    if manifest.get("provenance"):
        state = replace(state, meta={**state.meta, "provenance": manifest["provenance"]})
    return manifest, state


def _read_stored(path: str | Path):
    """``(manifest, tensors as stored)``: checksum verified, manifest shape and K/V names checked."""
    manifest, tensors = read_artifact(path, kind="prefix pack")
    check_manifest_shape(manifest, f"{Path(path) / 'manifest.json'}")
    from kvbridge.check.validate import tensors_match

    m, n = manifest["model"], manifest["guide"]["num_tokens"]
    if manifest.get("kv_layout", PER_LAYER) == STACKED:
        want = {"kv": (manifest["dtype"], (m["num_layers"], 2, None, m["num_kv_heads"], None, None))}
    else:
        kv = (None, m["num_kv_heads"], None, None)  # [batch, kv heads, tokens (sliding layers keep fewer), dim]
        want = {f"layers.{i}.{x}": (manifest["dtype"], kv) for i in range(m["num_layers"]) for x in ("keys", "values")}
    want["token_ids"] = (("int64", "int32"), (None, n))
    tensors_match(tensors, want, str(Path(path) / TENSOR_FILE), allow_extra=True, fix=FIX)
    return manifest, tensors


def _refusal(path, mismatches: list[Mismatch], forced_ok: bool) -> PackMismatchError:
    fields = tuple(x.field for x in mismatches)
    what = f"pack {path} does not match the model: " + "; ".join(x.describe() for x in mismatches)
    if forced_ok:
        fix = "re-create the pack with this model and tokenizer (kvbridge pack save), or pass --force to load it anyway"
    else:
        hard = [x.field for x in mismatches if not x.forceable]
        fix = (
            f"re-create the pack with this model (kvbridge pack save); {', '.join(hard)} cannot be forced: "
            "the stored tensors have another shape or meaning"
        )
    return PackMismatchError(what, fix, fields)


def load_pack(
    path: str | Path,
    model,
    *,
    tokenizer: Any = None,
    tokenizer_dir: str | Path | None = None,
    tokenizer_fp: dict | None = None,
    weights_fp: str | None = None,
    check_weights: bool = True,
    force: bool = False,
    host=None,
) -> Pack:
    """Restore a pack for ``model`` from its tensors (zero forward passes), refusing mismatches.

    The tokenizer is checked when given (a tokenizer object, its folder, or a precomputed
    :func:`tokenizer_fingerprint`): its fingerprint, and the guide text re-encoded to the stored
    ids. ``weights_fp`` skips re-hashing the weights when the caller has it already.
    """
    from kvbridge.kvstate_io import state_from_tensors
    from kvbridge.kvstate import all_finite

    path = Path(path)
    manifest, tensors = _read_stored(path)
    stacked = manifest.get("kv_layout") == STACKED
    if tokenizer_fp is None and (tokenizer is not None or tokenizer_dir is not None):
        tokenizer_fp = tokenizer_fingerprint(tokenizer, folder=tokenizer_dir)
    guide_now = None
    if tokenizer is not None and manifest["guide"].get("text"):
        try:
            guide_now = guide_ids_of(tokenizer, manifest["guide"]["text"])
        except KVBridgeError:
            guide_now = []
    mismatches = compare(
        manifest,
        model,
        tokenizer_fp=tokenizer_fp,
        weights_fp=weights_fp,
        guide_ids_now=guide_now,
        check_weights=check_weights,
        host=host,
    )
    hard = [x for x in mismatches if not x.forceable]
    if hard or (mismatches and not force):
        raise _refusal(path, mismatches, forced_ok=not hard)
    state = state_from_tensors(tensors, manifest["state"], str(path / TENSOR_FILE), FIX)
    if state.token_ids[0].tolist() != list(manifest["guide"]["token_ids"]):
        raise ArtifactError(
            f"pack {path}: stored token ids disagree with the manifest's guide ids", "re-create the pack"
        )
    notes: list[str] = []
    if mismatches:
        fields = ", ".join(x.field for x in mismatches)
        msg = (
            f"WARNING: pack {path} loaded with --force although {fields} differ: the restored cache is NOT the "
            "exact prefix state of this model and results are not comparable to a fresh prefill"
        )
        warnings.warn(msg, PackForceWarning, stacklevel=2)
        notes.append(msg)
        spec = adapter_of(model, host).spec_of(model)
        import torch

        if any(x.field == "dtype" for x in mismatches):
            state = state.to(dtype=getattr(torch, spec.dtype))  # a cast may overflow: check what it gave
            stacked = False
        state = replace(state, spec=spec, approximate=True, meta={**state.meta, "forced": fields})
    if manifest.get("provenance") or bool(manifest["state"].get("approximate", False)):
        notes.append(f"pack {path}: the cache is {origin_of(manifest)}")
    # NaN/inf are refused here, once per load (one kernel over the stacked K/V): cache() skips the check
    if not all_finite([tensors["kv"]] if stacked else (*state.keys, *state.values)):
        state.validate(check_finite=True, what=f"pack {path}")  # names the first bad layer
        raise ArtifactError(f"pack {path} has NaN/inf values", FIX)
    import transformers

    if manifest["transformers_version"] != transformers.__version__:
        notes.append(
            f"pack written with transformers {manifest['transformers_version']}, running "
            f"{transformers.__version__} (cache format checked and equal)"
        )
    return Pack(
        path=path,
        manifest=manifest,
        state=state,
        mismatches=tuple(mismatches),
        forced=bool(mismatches),
        notes=tuple(notes),
        finite_checked=True,
    )


def round_trip(model, guide_ids, guide_text: str | None, *, tokenizer_fp: dict, host=None) -> Pack:
    """The guide saved as a pack in a temporary folder and loaded back: the state a restore from disk
    gives (zero forward passes at load), checked like any pack."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvbridge-pack-") as tmp:
        ids, fps = list(guide_ids), {"tokenizer_fp": tokenizer_fp, "weights_fp": weights_fingerprint(model)}
        save_pack(model, f"{tmp}/pack", guide_ids=ids, guide_text=guide_text, host=host, **fps)
        return load_pack(f"{tmp}/pack", model, host=host, **fps)


def recompute_check(pack: Pack, model, host=None) -> float:
    """Max abs difference between the stored K/V and a fresh prefill of the guide ids (a forward pass)."""
    import torch

    fresh = adapter_of(model, host).extract(model, torch.as_tensor([pack.guide_ids]))
    pairs = zip((*pack.state.keys, *pack.state.values), (*fresh.keys, *fresh.values))
    return max((float((a.float() - b.float()).abs().max()) for a, b in pairs), default=0.0)


__all__ = [
    "Pack",
    "PackMismatchError",
    "PackForceWarning",
    "Mismatch",
    "save_pack",
    "PackIdentity",
    "save_state_pack",
    "origin_of",
    "load_pack",
    "round_trip",
    "read_pack",
    "read_pack_state",
    "pack_tensors",
    "STACKED",
    "PER_LAYER",
    "compare",
    "build_manifest",
    "tokenizer_fingerprint",
    "model_reference",
    "recorded_model",
    "cache_format",
    "positional_config",
    "check_manifest_shape",
    "guide_ids_of",
    "recompute_check",
    "SCHEMA_VERSION",
    "PACK_KIND",
    "TENSOR_FILE",
    "FORCEABLE",
    "REQUIRED",
    "NESTED_REQUIRED",
]
