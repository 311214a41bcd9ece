"""A :class:`~kvbridge.kvstate.KVState` as an artifact's tensors and manifest fields (the layer above
both :mod:`kvbridge.kvstate` and :mod:`kvbridge.artifacts`, which write and read the files)."""

from __future__ import annotations

from typing import Any

from kvbridge.errors import ArtifactError
from kvbridge.kvstate import KVState
from kvbridge.spec import ModelSpec


def state_tensors(state: KVState) -> dict:
    out: dict[str, Any] = {"token_ids": state.token_ids, "positions": state.positions}
    for i, (k, v) in enumerate(zip(state.keys, state.values)):
        out[f"layers.{i}.keys"] = k
        out[f"layers.{i}.values"] = v
    if state.rope_lengths is not None:
        out["rope_lengths"] = state.rope_lengths
    for i, t in state.indexer_keys:  # sparse attention: indexer keys travel with K/V
        out[f"layers.{i}.indexer_keys"] = t
    return out


def state_manifest(state: KVState) -> dict:
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


def state_of(tensors: dict, manifest: dict, spec: ModelSpec, keys, values, indexer=()) -> KVState:
    """The KVState of checked artifact ``tensors`` (K/V already split per layer) and its ``manifest``."""
    return KVState(
        keys=tuple(keys),
        values=tuple(values),
        token_ids=tensors["token_ids"],
        positions=tensors["positions"],
        spec=spec,
        rope_applied=bool(manifest.get("rope_applied", True)),
        rope_lengths=tensors.get("rope_lengths"),
        model_fingerprint=manifest.get("model_fingerprint", ""),
        approximate=bool(manifest.get("approximate", False)),
        indexer_keys=indexer,
    )


def state_from_tensors(tensors: dict, manifest: dict) -> KVState:
    from kvbridge.check.validate import tensors_match

    try:
        n = int(manifest["num_layers"])
        dtype = manifest.get("dtype")
        spec = ModelSpec.from_dict(manifest["spec"])
        B, T = manifest.get("batch_size"), manifest.get("num_tokens")
        if n != spec.num_layers:
            raise ValueError(f"{n} layers for a {spec.num_layers}-layer spec")
        # per layer, as the spec caches it (MLA latent / RoPE key widths, layers without KV)
        want = {
            f"layers.{i}.{kv}": (dtype, (B, spec.kv_heads_of(i), T, dim(i)))
            for i in range(n)
            for kv, dim in (("keys", spec.key_dim_of), ("values", spec.value_dim_of))
        }
        want.update({f"layers.{i}.indexer_keys": (dtype, (B, T, spec.indexer_dim())) for i in spec.indexer_layers})
        tensors_match(tensors, want, "KV state", fix="re-create it with this kvbridge version", allow_extra=True)
        keys = tuple(tensors[f"layers.{i}.keys"] for i in range(n))
        values = tuple(tensors[f"layers.{i}.values"] for i in range(n))
        indexer = tuple(
            (i, tensors[f"layers.{i}.indexer_keys"]) for i in range(n) if f"layers.{i}.indexer_keys" in tensors
        )
        return state_of(tensors, manifest, spec, keys, values, indexer)
    except KeyError as exc:
        raise ArtifactError(f"artifact is missing {exc.args[0]!r}", "re-create it with this kvbridge version") from None
    except (TypeError, ValueError) as exc:
        raise ArtifactError(
            f"artifact manifest is malformed ({exc})", "re-create it with this kvbridge version"
        ) from None


__all__ = ["state_tensors", "state_manifest", "state_of", "state_from_tensors"]
