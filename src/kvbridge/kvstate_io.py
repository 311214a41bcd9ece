"""A :class:`~kvbridge.kvstate.KVState` as an artifact's tensors and manifest fields (the layer above
both :mod:`kvbridge.kvstate` and :mod:`kvbridge.artifacts`, which write and read the files)."""

from __future__ import annotations

from typing import Any

from kvbridge.check.validate import tensors_match
from kvbridge.errors import ArtifactError
from kvbridge.kvstate import KVState
from kvbridge.spec import ModelSpec

_FIX = "re-create it with this kvbridge version"


def state_tensors(state: KVState) -> dict:
    out: dict[str, Any] = {"token_ids": state.token_ids, "positions": state.positions}
    for i, (k, v) in enumerate(zip(state.keys, state.values)):
        out[f"layers.{i}.keys"], out[f"layers.{i}.values"] = k, v
    if state.rope_lengths is not None:
        out["rope_lengths"] = state.rope_lengths
    for i, t in state.indexer_keys:  # sparse attention: indexer keys travel with K/V
        out[f"layers.{i}.indexer_keys"] = t
    return out


def state_manifest(state: KVState) -> dict:
    return {
        "spec": state.spec.to_dict(),
        **{k: getattr(state, k) for k in ("num_layers", "num_tokens", "batch_size")},
        "dtype": str(state.dtype).removeprefix("torch."),
        **{k: getattr(state, k) for k in ("rope_applied", "approximate", "model_fingerprint")},
    }


def state_from_tensors(tensors: dict, manifest: dict, where: str = "KV state", fix: str = _FIX) -> KVState:
    """The KVState of artifact ``tensors`` and its state ``manifest``, checked against the stored spec:
    K/V per layer (``layers.{i}.keys`` ...), or stacked in one tensor ``kv`` ``[layers, 2, B, H, T, D]``
    (a prefix pack's layout; the state's K/V are then views of it)."""
    try:
        n = int(manifest["num_layers"])
        dtype = manifest.get("dtype")
        spec = ModelSpec.from_dict(manifest["spec"])
        B, T = manifest.get("batch_size"), manifest.get("num_tokens")
        stacked = "kv" in tensors
        if stacked and (n != spec.num_layers or not spec.uniform_kv or spec.indexer_layers):
            raise ArtifactError(
                f"{where}: K/V stacked in one tensor, but the stored model spec ({spec.num_layers} "
                "layers) does not cache one K/V shape in every layer",
                fix,
            )
        if n != spec.num_layers:
            raise ValueError(f"{n} layers for a {spec.num_layers}-layer spec")
        if stacked:
            kv = (dtype, (n, 2, B, spec.num_kv_heads, T, spec.head_dim))
            want = {"kv": kv, "token_ids": (None, (B, T)), "positions": (None, (B, T))}
        else:  # per layer, as the spec caches it (MLA latent / RoPE key widths, layers without KV)
            want = {
                f"layers.{i}.{kv}": (dtype, (B, spec.kv_heads_of(i), T, dim(i)))
                for i in range(n)
                for kv, dim in (("keys", spec.key_dim_of), ("values", spec.value_dim_of))
            }
            want.update({f"layers.{i}.indexer_keys": (dtype, (B, T, spec.indexer_dim())) for i in spec.indexer_layers})
        tensors_match(tensors, want, where, fix=fix, allow_extra=True)
        layers = unstack(tensors) if stacked else tensors
        return KVState(
            keys=tuple(layers[f"layers.{i}.keys"] for i in range(n)),
            values=tuple(layers[f"layers.{i}.values"] for i in range(n)),
            token_ids=tensors["token_ids"],
            positions=tensors["positions"],
            spec=spec,
            rope_applied=bool(manifest.get("rope_applied", True)),
            rope_lengths=tensors.get("rope_lengths"),
            model_fingerprint=manifest.get("model_fingerprint", ""),
            approximate=bool(manifest.get("approximate", False)),
            indexer_keys=tuple((i, t) for i in range(n) if (t := tensors.get(f"layers.{i}.indexer_keys")) is not None),
        )
    except KeyError as exc:
        raise ArtifactError(f"{where}: the stored state is missing {exc.args[0]!r}", fix) from None
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{where}: the stored state manifest is malformed ({exc})", fix) from None


def unstack(tensors: dict) -> dict:
    """The per-layer names of stacked tensors (views of ``kv``, no copy)."""
    out = {k: v for k, v in tensors.items() if k != "kv"}
    for i, pair in enumerate(tensors["kv"].unbind(0)):
        out[f"layers.{i}.keys"], out[f"layers.{i}.values"] = pair.unbind(0)
    return out
