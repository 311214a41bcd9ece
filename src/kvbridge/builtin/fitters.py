"""Built-in fitters: ``ridge`` (default), ``ridge-headwise``, ``sklearn`` and ``translator``.

Registration imports nothing heavy: each factory is loaded when its fitter is used.
"""

from __future__ import annotations

from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Fitter

FITTERS = (
    Fitter(
        name="ridge",
        description="centred affine ridge per target (layer, KV head), K and V apart, on all KV heads of the "
        "top-k source layers (selected by single-layer R²); streaming float64 statistics",
        factory="kvbridge.fit.ridge:RidgeFitter",
    ),
    Fitter(
        name="ridge-headwise",
        description="one source KV head per target KV head (assigned by R²): small artifacts, few observations",
        factory="kvbridge.fit.headwise:HeadwiseFitter",
    ),
    Fitter(
        name="sklearn",
        description="any scikit-learn linear regressor (--estimator module:Class, JSON options) on a capped "
        "materialised sample; Ridge(alpha=0.01) agrees with ridge",
        factory="kvbridge.fit.sklearn_fitter:SklearnFitter",
    ),
    Fitter(
        name="translator",
        description="the ridge map plus a trained residual per target layer (low rank, or a small MLP) on the "
        "target's attention-output error from its stored queries; optional KL stage; seeded, resumable",
        factory="kvbridge.fit.translator:TranslatorFitter",
    ),
)


@hookimpl
def kvbridge_register_fitters(register):
    for fitter in FITTERS:
        register(fitter)
