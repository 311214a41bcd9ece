"""``sklearn``: any scikit-learn (or compatible) linear regressor, for research.

``--estimator sklearn.linear_model:RidgeCV --estimator-options '{"alphas": [0.01, 1, 100]}'``:
the estimator is imported from ``"module:Class"``, built with the JSON options and fitted,
per target layer and separately for K and V, on a *materialised* sample of at most
``max_samples`` observations (the first sequences of the calibration, train split), with the
same features as ``ridge`` (all KV heads of the top-k source layers, selected by single-layer
R² on statistics of that same sample). The default is ``Ridge(alpha=0.01)``, which gives the
``ridge`` fitter's coefficients on the same observations (tested to 1e-4).

Mappings are stored as tensors, never pickles, so the estimator must end as a linear map:
it needs ``coef_`` (``[outputs, features]``) and optionally ``intercept_``. A non-linear
regressor is refused. Held-out R² is measured by ``predict`` on the held-out sequences of
the sample. Single process only: the sample lives in one process's memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from kvbridge.fit.protocol import FitReport
from kvbridge.fit.ridge import check_top_k
from kvbridge.fit.solve import LOW_R2, FitError, check_determined, dims as dims_of, heldout_fields, scores_record
from kvbridge.fit.solve import require_calibration

DEFAULT_ESTIMATOR = "sklearn.linear_model:Ridge"
DEFAULT_OPTIONS = {"alpha": 0.01}
DEFAULT_MAX_SAMPLES = 100_000


def load_estimator(path: str, options):
    from kvbridge.check.validate import parse_json
    from kvbridge.plugin_types import load_object

    if ":" not in str(path):
        raise FitError(f"--estimator {path!r} must be 'module:Class'", "use e.g. sklearn.linear_model:RidgeCV")
    if isinstance(options, str):  # one-line errors naming the option (invalid or too deeply nested JSON)
        what = "JSON object, e.g. '{\"alpha\": 0.01}'"
        options = parse_json(options, "--estimator-options", what=what, error=FitError) if options.strip() else {}
    if not isinstance(options, dict):
        raise FitError(
            f"--estimator-options must be a JSON object, got {type(options).__name__}", "pass e.g. '{\"alpha\": 0.01}'"
        )
    try:
        cls = load_object(path)
    except (ImportError, AttributeError) as exc:
        raise FitError(f"cannot import estimator {path!r} ({exc})", "check the module and class name") from None
    try:
        est = cls(**options)
    except TypeError as exc:
        raise FitError(f"estimator {path} rejects the options {options} ({exc})", "check --estimator-options") from None
    if not (hasattr(est, "fit") and hasattr(est, "predict")):
        raise FitError(f"{path} is not a regressor (no fit/predict)", "pass a scikit-learn regressor")
    return est, options


def _linear(est, path: str, p: int, q: int):
    coef = getattr(est, "coef_", None)
    if coef is None:
        raise FitError(
            f"estimator {path} has no coef_: kvbridge mappings are linear maps stored as tensors "
            "(no pickles), so only linear regressors can be used",
            "use a linear estimator (Ridge, RidgeCV, LinearRegression, Lasso, ElasticNet, ...)",
        )
    coef = np.asarray(coef, dtype=np.float64).reshape(q, p)
    intercept = np.asarray(getattr(est, "intercept_", 0.0), dtype=np.float64) * np.ones(q)
    return torch.from_numpy(coef.T.copy()), torch.from_numpy(intercept.copy())


@dataclass(frozen=True)
class SklearnOptions:
    """Options of ``sklearn`` (``-o key=value``; ``--estimator`` / ``--estimator-options`` /
    ``--max-samples`` are shortcuts)."""

    top_k: int = 4  # source layers per target layer
    estimator: str | None = None  # "module:Class" (None: sklearn.linear_model:Ridge with alpha 0.01)
    estimator_options: dict | str | None = None  # keyword options of the estimator (a dict or JSON text)
    max_samples: int | None = DEFAULT_MAX_SAMPLES  # cap on materialised observations
    low_r2: float = LOW_R2  # warn below this mean held-out R²

    def __post_init__(self):
        check_top_k(self.top_k)


class SklearnFitter:
    """``sklearn``: any scikit-learn linear regressor on a capped materialised sample."""

    name = "sklearn"
    Options = SklearnOptions

    def fit(self, source_spec, target_spec, calibration=None, options: SklearnOptions = SklearnOptions()):
        from sklearn.base import clone

        from kvbridge.fit.mapping import FittedMapping, LayerMap
        from kvbridge.fit.plan import layer_stats_bytes
        from kvbridge.fit.select import single_layer_r2, top_k as pick
        from kvbridge.fit.stats import LayerStats

        require_calibration(
            calibration,
            "sklearn",
            "materialises its sample in one process",
            fix="run it as a single process, or use --fitter ridge under torchrun",
        )
        path, est_options = options.estimator or DEFAULT_ESTIMATOR, options.estimator_options or {}
        if options.estimator is None and options.estimator_options is None:
            est_options = DEFAULT_OPTIONS
        proto, est_options = load_estimator(path, est_options)
        dims = dims_of(source_spec, target_spec)
        ls, lt = source_spec.num_layers, target_spec.num_layers
        k = min(int(options.top_k), ls)
        fs = dims["src_heads"] * dims["src_dim"]
        ht, dt = dims["tgt_heads"], dims["tgt_dim"]
        feats, held = calibration.sample(options.max_samples)
        train = ~held
        n_train, n_held = int(train.sum()), int(held.sum())
        check_determined(
            n_train,
            k * fs,
            what=f"top-k {k} source layers x {fs} dims (sample of {len(held)})",
            fix="raise --max-samples or --tokens, lower --top-k or --stride",
        )
        # selection on statistics of the same sample (exactly what ridge sees on the same data)
        job = LayerStats(
            range(ls),
            range(lt),
            **dims,
            xx_block="full" if layer_stats_bytes(ls, lt, fs, dims["src_dim"], ht * dt) < 2**31 else "layer",
        )
        job.update(feats, held)
        scores = single_layer_r2(job)
        selection = pick(scores["mean"], range(ls), k)
        del job
        layers, r2 = [], {"k": [], "v": []}  # held-out R² per target layer ([H_t], None: nothing held out)
        for t in range(lt):
            sel = torch.tensor(selection[t])
            maps = {}
            for c in ("k", "v"):
                x = feats["x" + c].index_select(1, sel).reshape(len(held), -1).double()
                y = feats["y" + c][:, t].reshape(len(held), -1).double()
                est = clone(proto).fit(x[train].numpy(), y[train].numpy())
                maps[c] = _linear(est, path, x.shape[1], y.shape[1])  # (w, b)
                r2[c].append(None)
                if n_held:
                    pred = np.asarray(est.predict(x[held].numpy()), dtype=np.float64).reshape(n_held, -1)
                    yh = y[held].numpy()
                    err = ((yh - pred) ** 2).reshape(n_held, ht, dt).sum(axis=(0, 2))
                    tot = ((yh - yh.mean(0)) ** 2).reshape(n_held, ht, dt).sum(axis=(0, 2))
                    r2[c][-1] = torch.from_numpy(np.where(tot > 0, 1 - err / np.maximum(tot, 1e-300), 0.0))
            layers.append(LayerMap("dense", tuple(selection[t]), *(x.float() for c in "kv" for x in maps[c])))
        report = FitReport(
            fitter=self.name,
            params={**asdict(options), "top_k": k, "estimator": path, "estimator_options": est_options},
            layer_selection=[list(s) for s in selection],
            selection_scores=scores_record(scores),
            **heldout_fields(r2["k"], r2["v"], options.low_r2, measured=bool(n_held)),
            alpha_chosen=None,
            observations={"train": n_train, "heldout": n_held, "features_per_head": k * fs},
        )
        return FittedMapping(source_spec, target_spec, layers, fitter=self.name, report=report)
