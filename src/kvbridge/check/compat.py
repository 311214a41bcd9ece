"""The compatibility check: can a KV cache of model SRC become a cache of model TGT, and how?

:func:`check` compares two :class:`~kvbridge.spec.ModelSpec` axis by axis and returns a
frozen :class:`Report`. Each :class:`Axis` has the source value, the target value, a verdict
and one line saying what a transfer must do about it:

=============  ==================================================================================
axis           what decides it
=============  ==================================================================================
model          same config (direct reuse), same architecture (fine-tune / other positions), or a
               different model (its K/V live in another space: a fitted mapping is needed even
               where shapes agree)
layers         KV layer counts (layers without KV excluded); layer-mapping strategies
kv_heads       KV heads as cached (GQA / MQA; Falcon's new architecture caches duplicated heads)
head_dim       per-head K/V width
positional     rope / absolute / alibi / none: absolute positions are mixed into the keys by the
               layers below and cannot be removed, so absolute <-> anything else is blocking
rope           type, theta, scaling, partial factor, interleaving, per-layer-type tables
attention      full / sliding window (size) / hybrid layer types / layers without KV
dtype          a cast
cache_format   dynamic, sliding-window layers, static, quantized, offloaded
tokenizer      fingerprints of the tokenizer files; ``unknown`` without files
=============  ==================================================================================

Axis verdicts are ``same``, ``mappable`` (a transfer has something to do) and ``blocking``.
Plugin findings (``kvbridge_check_compatibility``) are merged: a finding on a core axis raises
that axis' verdict when it is more severe; other findings become extra axes named after the
finding (verdicts may then also be ``info`` or ``warning``).

The overall verdict:

- ``incompatible``: some axis or finding is blocking;
- ``mappable``: a fitted mapping is needed (different model, or layers / KV heads / head dim
  differ); the reasons name the axes;
- ``rope-reapply``: same architecture and cache geometry, but positions differ (RoPE tables,
  or RoPE vs position-free): strip the source RoPE and apply the target's; values as they are;
- ``identity``: same architecture, geometry and positions: the cache is reused as it is.

:func:`kvbridge.models.compat.check_models` (two model references) adds kvbridge's own measured verdicts on that very
pair (:mod:`kvbridge.check.measured`, ``manifests/results/``) as ``Report.measured``.

``mappable`` notes on ``attention``, ``dtype``, ``cache_format`` and ``tokenizer`` are listed in the
reasons but do not change the overall verdict. ``Report.strict_failures`` lists what
``kvbridge check --strict`` refuses (see there).

Where things live: the rows, the report and the verdict rules in :mod:`kvbridge.check.report`; the
single axes in :mod:`kvbridge.check.axes`; this module builds a report from two sides and
re-exports what a caller needs (``from kvbridge.check.compat import check, Side, Report, Axis, ...``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from kvbridge.check.axes import cache_format_of, core_axes
from kvbridge.check.report import AXES, VERDICTS, Axis, Report, _merge, _overall
from kvbridge.spec import ModelSpec
from kvbridge.plugins import host_or_default


@dataclass(frozen=True)
class Side:
    """One side of a check: the spec plus what is known about the model beyond it.

    ``config`` / ``generation`` are the config and generation-config mappings (None when only a
    spec is known), ``tokenizer`` a :class:`~kvbridge.check.tokenizer_fp.TokenizerFingerprint`
    (None = unknown), ``weights`` the full-content weight-file digest
    (:func:`kvbridge.models.fingerprint.weights_digest`; None = no weight files).
    """

    spec: ModelSpec
    name: str = ""
    config: Mapping | None = None
    generation: Mapping | None = None
    tokenizer: Any = None
    weights: str | None = None

    @classmethod
    def of(cls, resolved, *, host=None, tokenizer: Any = None, weights: bool = True) -> "Side":
        """The side of a resolved :class:`~kvbridge.models.ModelRef` (``tokenizer`` overrides its own)."""
        return cls(
            spec=resolved.spec(host),
            name=resolved.name,
            config=resolved.config,
            generation=resolved.generation_config,
            tokenizer=resolved.tokenizer() if tokenizer is None else tokenizer,
            weights=resolved.weights_digest() if weights else None,
        )


def check(source, target, *, host=None, same_model: bool = False, plugins: bool = True) -> Report:
    """Compare two models into a Report; each side is a :class:`Side` or a bare ModelSpec.

    ``same_model`` says both sides are the same model reference (same files): the model and
    tokenizer axes are then ``same`` even without tokenizer files. ``plugins=False`` skips the
    plugin findings (the core axes only). With both weight digests known, a same-config pair
    with different weights is ``mappable``, not ``identity``.
    """
    s, t = (side if isinstance(side, Side) else Side(spec=side) for side in (source, target))
    axes = core_axes(s, t, same_model)  # before any plugin's check runs
    findings = tuple(host_or_default(host).check_findings(s.spec, t.spec)) if plugins else ()
    axes = _merge(axes, findings)
    verdict, reasons = _overall(axes)
    return Report(
        source=s.spec,
        target=t.spec,
        axes=tuple(axes),
        verdict=verdict,
        reasons=tuple(reasons),
        findings=findings,
        source_name=s.name,
        target_name=t.name,
    )


__all__ = ["Axis", "Report", "Side", "check", "cache_format_of", "AXES", "VERDICTS"]
