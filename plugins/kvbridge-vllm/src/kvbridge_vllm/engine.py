"""The ``vllm`` engine: :class:`~kvbridge.kvstate.KVState` <-> an entry of the vLLM prefix store.

``export_state(state, model, out)`` writes the entry the connector loads for the safetensors
folder ``model`` that vLLM serves; ``import_state(src, model)`` reads an entry (one the connector
saved from vLLM's own prefill, or one kvbridge wrote) back into a KVState. What is checked on the
way: the state's geometry (layers, KV heads, head dim), RoPE table and token ids against the
model; keys must carry RoPE (they are rotated here when they do not). Nothing is rounded unless
``dtype`` asks for it (then once, recorded). A transferred or steered state (``state.approximate``)
is stored as approximate, and stays so when read back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvbridge.engines import ModuleEngine, kv_state_summary
from kvbridge.errors import ConfigError, StateError

from kvbridge_vllm import store


def _check(state, model: store.ModelIdentity, what: str) -> None:
    spec = state.spec
    got = (state.num_layers, spec.num_kv_heads, spec.head_dim)
    want = (model.num_layers, model.num_kv_heads, model.head_dim)
    if got != want or not spec.uniform_kv:
        raise StateError(
            f"{what} caches {got[0]} layers x {got[1]} KV heads x {got[2]}; {model.name} caches "
            f"{want[0]} x {want[1]} x {want[2]}",
            "transfer the state to this model first (kvbridge transfer) or pass the folder it came from",
        )
    if store.rope_record(spec) != model.rope:
        raise StateError(
            f"{what}: keys rotated with RoPE {store.rope_record(spec)}, {model.name} uses {model.rope}",
            "transfer the state to this model (kvbridge transfer)",
        )
    if state.batch_size != 1:
        raise StateError(
            f"{what} has a batch of {state.batch_size}; a store entry holds one prefix", "export one row at a time"
        )
    if state.states or state.indexer_keys:
        raise StateError(f"{what} carries recurrent or indexer state", "export states of plain attention models")
    positions = state.positions[0].tolist()
    if positions != list(range(len(positions))):
        raise StateError(
            f"{what} sits at positions {positions[0]}..{positions[-1]} with gaps; vLLM loads a prefix at 0..T-1",
            "export a state computed from the start of the prompt",
        )


def export_state(
    state,
    model: Any,
    out: str | os.PathLike | None = None,
    *,
    dtype: str | None = None,
    provenance: str | None = None,
    host=None,
    **_ignored,
) -> bytes:
    """The store entry of ``state`` for the folder ``model`` (bytes; written atomically into the
    store folder ``out`` when given, or to ``out`` itself when it ends in ``.safetensors``).
    ``dtype``: the cache dtype vLLM runs (default: the state's own). ``provenance``: where the cache
    came from, in words (default: the state's ``meta["provenance"]``, e.g. a transferred pack's
    record, else ``kvbridge``)."""
    import torch

    target = store.model_identity(model, host=host)
    _check(state, target, "KV state")
    if not state.rope_applied:
        state = state.apply_rope(host=host)
    want = getattr(torch, dtype) if dtype else state.dtype
    kv = torch.stack([torch.stack((k[0], v[0])) for k, v in zip(state.keys, state.values)]).to(want)
    if not bool(torch.isfinite(kv).all()):
        raise StateError("KV state has NaN/inf values", "recompute the cache")
    approximate = bool(state.approximate)
    extra = {"rounded_from": str(state.dtype).removeprefix("torch.")} if want != state.dtype else {}
    ids = state.token_ids[0]
    provenance = provenance or provenance_text(state.meta.get("provenance")) or "kvbridge"
    data = store.entry_bytes(kv, ids, target, approximate=approximate, provenance=provenance, extra=extra)
    if out is not None:
        store.write_entry(data, out, ids.tolist(), target)
    return data


def provenance_text(record: Any) -> str | None:
    """A pack's provenance record (``{"kind": "transferred", "source": ..., "mapping": ...}``) as
    the one line a store entry keeps; a string passes through."""
    if isinstance(record, str) or record is None:
        return record or None
    if not isinstance(record, dict):
        return None
    parts = [str(record.get("kind") or "kvbridge")]
    parts += [f"{k} {record[k]}" for k in ("source", "mapping") if record.get(k)]
    return ", ".join(parts)


def import_state(src: Any, model: Any, *, dtype=None, host=None):
    """The :class:`~kvbridge.kvstate.KVState` of a store entry (a path) for the folder ``model``:
    refused in one line when it is unreadable or made for another model; rows in ``dtype``
    (default: as stored)."""
    import torch

    from kvbridge.kvstate import KVState
    from kvbridge.models import resolve

    path = Path(src)
    if path.is_dir():
        raise ConfigError(f"{path} is a folder", "pass one entry file of the store (kvbridge engine import FILE MODEL)")
    target = store.model_identity(model, host=host)
    try:
        entry = store.read_entry_header(path)
    except store.EntryError as exc:
        raise StateError(str(exc), "export the entry again (kvbridge pack export --engine vllm)") from None
    why = store.mismatch(entry, target, entry.kv_dtype)
    if why:
        raise StateError(f"{path}: {why}", "import it with the model folder whose vLLM saved it")
    kv = store.read_kv(entry, start=0, stop=entry.num_tokens)
    if dtype is not None:
        kv = kv.to(dtype)
    spec = resolve(str(model), host=host).spec(host=host)
    spec = replace(spec, dtype=str(kv.dtype).removeprefix("torch."))
    T = entry.num_tokens
    state = KVState(
        keys=tuple(kv[i, 0].unsqueeze(0) for i in range(kv.shape[0])),
        values=tuple(kv[i, 1].unsqueeze(0) for i in range(kv.shape[0])),
        token_ids=torch.tensor([list(entry.token_ids)], dtype=torch.long),
        positions=torch.arange(T, dtype=torch.long)[None],
        spec=spec,
        rope_applied=True,
        model_fingerprint=str(entry.manifest["model"].get("config_fingerprint", "")),
        approximate=entry.approximate,
        meta={"engine": "vllm", "file": str(path), "provenance": entry.manifest.get("provenance")},
    )
    return state.validate(what=f"{path} (vLLM store entry)")


def describe_file(src: Any, model: Any, host=None) -> dict:
    """What ``kvbridge engine import --engine vllm`` reports."""
    state = import_state(src, model, host=host)
    entry = store.read_entry_header(src)
    return {
        "file": str(src),
        "format": store.FORMAT,
        "version": store.VERSION,
        "model": store.model_identity(model, host=host).name,
        "provenance": entry.manifest.get("provenance"),
        "approximate": entry.approximate,
        "keys": entry.manifest.get("keys"),
        "kv_state": kv_state_summary(state),
    }


@dataclass(frozen=True)
class VllmEngine(ModuleEngine):
    """The engine object the plugin registers (:class:`kvbridge.plugin_types.EngineProtocol`)."""

    name: str = "vllm"
    module: str = __name__


ENGINE = VllmEngine()

__all__ = ["ENGINE", "VllmEngine", "export_state", "import_state", "describe_file", "provenance_text"]
