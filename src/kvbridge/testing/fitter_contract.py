"""The contract every fitter and every metric must pass (built-ins and plugins alike)::

    from kvbridge.testing import FitterContract, MetricContract

    class TestMyFitter(FitterContract):
        fitter = MyFitter                # a class following kvbridge.fit.protocol.FitterProtocol
        options = {"top_k": 2}           # options for the planted fit (-o key=value style)

    class TestMyMetric(MetricContract):
        metric = Metric("my_metric", "what it measures", my_metric, higher_is_better=True)

``FitterContract`` fits the fitter on a planted pair (:mod:`kvbridge.testing.planted`: the
target's cache is an exact linear map of the source's) and checks that the fit recovers it
(held-out R² and the transferred cache against the target's own), that the mapping
round-trips through ``save_mapping`` / ``load_mapping`` and that its report is a
:class:`~kvbridge.fit.protocol.FitReport` with the fields filled. ``MetricContract`` runs the
metric on synthetic evaluation views: one value per replicate, a number (or ``nan``) on
every condition, ``0``/ideal on a perfect copy when it declares so, and replicate-consistent.

Checks that cannot apply raise :class:`~kvbridge.testing.contract.NotApplicable` (the
classes turn it into a pytest skip), e.g. the round trip of a fitter that makes no artifact.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from kvbridge.testing.contract import NotApplicable, host_with_factory, run_or_skip
from kvbridge.testing.planted import planted_pair, tiny_llama, token_ids

#: the planted fit must reach this held-out R² (mean over target heads, K and V)
PLANTED_R2 = 0.999
#: transferred vs native target cache: max abs error relative to the cache's max magnitude
PLANTED_REL_ERR = 1e-2


@functools.lru_cache(maxsize=4)
def planted_fixture(insert_before: tuple = (1, 3), kv_dup: int = 2, sequences: int = 40) -> dict:
    """A cached planted pair: ``source``, ``target``, ``truth`` and calibration ``ids``."""
    source = tiny_llama(seed=0)
    if kv_dup == 0:  # the pair is one model: the planted map is the identity
        target, truth = source, list(range(source.config.num_hidden_layers))
    else:
        target, truth = planted_pair(source, insert_before=insert_before, kv_dup=kv_dup)
    return {"source": source, "target": target, "truth": truth, "ids": token_ids(sequences)}


def check_fitter_protocol(fitter: Any) -> None:
    """Members, a frozen options dataclass whose defaults build, and generic option parsing."""
    from kvbridge.fit.protocol import build_options, fitter_problem, option_fields

    missing = fitter_problem(fitter)
    assert missing is None, f"fitter {getattr(fitter, 'name', fitter)!r} is missing protocol member {missing!r}"
    opts = fitter.Options
    assert opts.__dataclass_params__.frozen, f"{opts.__name__} must be a frozen dataclass"
    default = build_options(opts, {})
    for key, (_tp, value) in option_fields(opts).items():  # every default survives a string round trip
        if isinstance(value, (bool, int, float, str)):
            assert getattr(build_options(opts, {key: str(value)}), key) == value, f"option {key} does not parse"
    assert dataclasses.asdict(default) is not None


def fit_planted(fitter: Any, options: dict, fixture: dict):
    """``(mapping, host)``: the fitter run through :func:`kvbridge.fit.fit` on a planted pair."""
    from kvbridge.fit import fit
    from kvbridge.fit.calibrate import CalibrationConfig

    host, _ = host_with_factory("fitter", fitter)  # a built-in of the same name must be this very class
    mapping = fit(
        fixture["source"],
        fixture["target"],
        fixture["ids"],
        fitter=fitter.name,
        options=dict(options),
        calibration=CalibrationConfig(stride=2),
        host=host,
        distributed=None,
    )
    return mapping, host


def check_recovers_planted(
    mapping, host, fixture: dict, *, min_r2: float = PLANTED_R2, max_rel_err: float = PLANTED_REL_ERR
) -> dict:
    """Held-out R² (when reported) and the transferred cache against the target's own."""
    import torch

    from kvbridge.transfer import transfer

    report = getattr(mapping, "report", None)
    r2 = None
    if report is not None and (report.r2_summary or {}).get("heldout"):
        r2 = report.r2_summary["mean"]
        assert r2 >= min_r2, f"held-out R² {r2:.6f} < {min_r2} on a planted (exactly linear) pair"
    source, target = fixture["source"], fixture["target"]
    ids = token_ids(2, 24, seed=77)
    state = host.adapter_of(source).extract(source, ids)
    native = host.adapter_of(target).extract(target, ids)
    moved = transfer(state, mapping, host.adapter_of(target).spec_of(target), host=host)
    worst = 0.0
    for a, b in zip(moved.keys + moved.values, native.keys + native.values):
        scale = float(b.abs().max()) or 1.0
        worst = max(worst, float((a.float() - b.float()).abs().max()) / scale)
    assert worst <= max_rel_err, f"transferred cache differs from the target's own by {worst:.3g} (relative)"
    return {
        "r2": r2,
        "rel_err": worst,
        "layers": len(moved.keys),
        "shape_ok": torch.Size(moved.keys[0].shape) == native.keys[0].shape,
    }


def check_round_trip(mapping, tmp_path, fixture: dict, host) -> None:
    """save_mapping -> load_mapping gives the same tensors, selection and report."""
    import torch

    from kvbridge.fit.artifact import load_mapping, save_mapping

    if not hasattr(mapping, "tensors"):
        raise NotApplicable(f"the {getattr(mapping, 'name', 'fitter')} mapping makes no artifact")
    out = tmp_path / "mapping"
    save_mapping(mapping, out)
    back = load_mapping(out, source=fixture["source"], target=fixture["target"], host=host)
    a, b = mapping.tensors(), back.tensors()
    assert set(a) == set(b), f"tensors {sorted(set(a) ^ set(b))} lost in the round trip"
    for name in a:
        assert torch.equal(a[name].float(), b[name].float()), f"tensor {name} changed in the round trip"
    assert back.layer_selection() == mapping.layer_selection()
    assert back.report.r2_summary == mapping.report.r2_summary
    assert back.report.fitter == mapping.report.fitter == mapping.fitter


def check_report(mapping, fixture: dict) -> None:
    from kvbridge.fit.protocol import FitReport

    report = getattr(mapping, "report", None)
    if report is None and getattr(mapping, "exact", False):
        raise NotApplicable("an exact mapping measures nothing")
    assert isinstance(report, FitReport), f"report is a {type(report).__name__}, not a FitReport"
    layers = fixture["target"].config.num_hidden_layers
    assert report.fitter and len(report.layer_selection) == layers, "layer_selection needs one row per target layer"
    assert set(report.heldout_r2) == {"k", "v"} and "heldout" in report.r2_summary
    assert isinstance(report.params, dict) and isinstance(report.observations, dict)
    assert isinstance(report.to_dict()["warnings"], list)


class FitterContract:
    """Subclass with ``fitter = MyFitter`` (and ``options``, ``planted``) to run the contract."""

    fitter: Any = None
    options: dict = {}
    #: the planted pair: inserted identity layers and KV-head duplication (kv_dup=0: source == target)
    planted: dict = {"insert_before": (1, 3), "kv_dup": 2}
    min_r2: float = PLANTED_R2

    def _fixture(self) -> dict:
        p = dict(self.planted)
        return planted_fixture(tuple(p.get("insert_before", ())), int(p.get("kv_dup", 2)), int(p.get("sequences", 40)))

    def _fit(self):
        key = "_kvbridge_contract_fit"
        cached = self.__class__.__dict__.get(key)
        if cached is None:
            cached = fit_planted(self.fitter, self.options, self._fixture())
            setattr(self.__class__, key, cached)
        return cached

    def test_protocol(self):
        check_fitter_protocol(self.fitter)

    def test_recovers_a_planted_map(self):
        mapping, host = self._fit()
        check_recovers_planted(mapping, host, self._fixture(), min_r2=self.min_r2)

    def test_round_trips_through_save_and_load(self, tmp_path):
        mapping, host = self._fit()
        run_or_skip(check_round_trip, mapping, tmp_path, self._fixture(), host)

    def test_report_has_the_fields(self):
        run_or_skip(check_report, self._fit()[0], self._fixture())
