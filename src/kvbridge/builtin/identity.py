"""The identity baseline: same content geometry, mapping = copy. Exact by construction.

The mapping itself (:class:`kvbridge.transfer.IdentityMapping`) is core: the transfer path
uses it for same-model transfers; this plugin offers it as the ``identity`` fitter.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbridge.errors import StateError
from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Fitter
from kvbridge.transfer import IdentityMapping, content_geometry

__all__ = ["IdentityMapping", "IdentityFitter", "IdentityOptions", "content_geometry"]


@dataclass(frozen=True)
class IdentityOptions:
    """The identity fitter has no options."""


class IdentityFitter:
    """``identity``: copy K/V (same content geometry only; the exact baseline)."""

    name = "identity"
    Options = IdentityOptions

    def fit(self, source_spec, target_spec, calibration=None, options: IdentityOptions = IdentityOptions()):
        if content_geometry(source_spec) != content_geometry(target_spec):
            raise StateError(
                f"the identity fitter needs the same content geometry; source={content_geometry(source_spec)}, "
                f"target={content_geometry(target_spec)} (layers, kv_heads, head_dim)",
                "use --fitter ridge",
            )
        return IdentityMapping()


@hookimpl
def kvbridge_register_fitters(register):
    register(
        Fitter(
            name="identity",
            description="copy K/V (same content geometry only; exact baseline)",
            factory="kvbridge.builtin.identity:IdentityFitter",
        )
    )
