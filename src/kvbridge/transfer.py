"""Apply a mapping to a KV state: strip source RoPE -> map content -> apply target RoPE.

A *mapping* is any object with ``map_content(state, target_spec) -> KVState`` that takes a
content-space state (keys with RoPE stripped) of the source geometry and returns a
content-space state of the target geometry, and an ``exact`` flag. The identity mapping is
here (:class:`IdentityMapping`, which the built-in ``identity`` fitter returns); fitted
mappings come from fitter plugins.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvbridge.errors import StateError
from kvbridge.check.spec import ModelSpec

if TYPE_CHECKING:  # pragma: no cover
    from kvbridge.kvstate import KVState


def content_geometry(spec) -> tuple:
    """``(layers, KV heads, head dim)``: what must match for a copy to be a valid mapping."""
    return (spec.num_layers, spec.num_kv_heads, spec.head_dim)


@dataclass(frozen=True)
class IdentityMapping:
    """Copies content-space K/V; only valid when layers, KV heads and head dim all match."""

    exact: bool = True
    name: str = "identity"

    def map_content(self, state, target_spec):
        if content_geometry(state.spec) != content_geometry(target_spec):
            raise StateError(
                f"identity mapping needs the same content geometry; source (layers, kv_heads, head_dim)="
                f"{content_geometry(state.spec)}, target={content_geometry(target_spec)}",
                "fit a mapping with `kvbridge fit` (e.g. --fitter ridge)")
        out = state.map_tensors(lambda t: t.clone())
        return replace(out, spec=target_spec, rope_lengths=None)


def transfer(state: "KVState", mapping: Any, target_spec: ModelSpec | None = None, *, target_positions=None,
             host=None) -> "KVState":
    """A target-geometry cache (RoPE applied for the target) from a source state.

    ``target_spec`` defaults to the mapping's own ``target_spec`` (fitted mappings carry it).
    """
    target_spec = target_spec or getattr(mapping, "target_spec", None) or state.spec
    if state.spec.positional not in ("rope", "none") and state.spec.positional != target_spec.positional:
        raise StateError(
            f"source {state.spec.model_type!r} uses {state.spec.positional} positions: they are baked into "
            "its cached keys and cannot be stripped",
            "transfer between models of the same positional scheme")
    content = state.strip_rope(host=host)
    mapped = mapping.map_content(content, target_spec)
    if mapped.rope_applied:
        raise StateError("mapping returned keys marked as carrying RoPE", "return content-space keys")
    positions = state.positions if target_positions is None else target_positions
    out = mapped.apply_rope(positions, spec=target_spec, host=host)
    return replace(out, approximate=state.approximate or not getattr(mapping, "exact", False))


def identity_transfer(state: "KVState", target_spec: ModelSpec | None = None, *, target_positions=None,
                      host=None) -> "KVState":
    """Same-model transfer through the full canonical path (the built-in exact baseline)."""
    return transfer(state, IdentityMapping(), target_spec or state.spec,
                    target_positions=target_positions, host=host)
