"""The identity baseline: same content geometry, mapping = copy. Exact by construction."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvbridge.errors import StateError
from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Fitter


def content_geometry(spec) -> tuple:
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


class IdentityFitter:
    """Fitter protocol: ``fit(source_spec, target_spec, **kw) -> mapping``."""

    name = "identity"

    def fit(self, source_spec, target_spec, **_):
        if content_geometry(source_spec) != content_geometry(target_spec):
            raise StateError(
                f"the identity fitter needs the same content geometry; source={content_geometry(source_spec)}, "
                f"target={content_geometry(target_spec)} (layers, kv_heads, head_dim)",
                "use --fitter ridge")
        return IdentityMapping()


@hookimpl
def kvbridge_register_fitters(register):
    register(Fitter(name="identity", description="copy K/V (same content geometry only; exact baseline)",
                    factory="kvbridge.builtin.identity:IdentityFitter"))
