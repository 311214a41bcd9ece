"""Wilson intervals, the retention ratios and paired differences against hand-computed values."""

from __future__ import annotations

import math

import pytest

from kvbridge import stats


def test_wilson_known_values():
    lo, hi = stats.wilson(0, 10)
    assert lo == 0 and math.isclose(hi, 0.27753, abs_tol=1e-4)
    lo, hi = stats.wilson(5, 10)
    assert math.isclose(lo, 0.23659, abs_tol=1e-4) and math.isclose(hi, 0.76341, abs_tol=1e-4)
    lo, hi = stats.wilson(10, 10)
    assert math.isclose(lo, 0.72247, abs_tol=1e-4) and hi == 1
    assert stats.wilson(0, 0) is None


def test_ratios_and_their_undefined_cases():
    assert stats.retention(0.45, 0.5) == pytest.approx(0.9)
    assert stats.retention(0.3, 0.0) is None
    assert stats.floor_retention(0.4, 0.5, 0.25) == pytest.approx(0.6)
    assert stats.floor_retention(0.2, 0.25, 0.25) is None  # the target is not above chance
    # the Qwen-like case: high retention, little of the gap closed
    assert stats.retention(0.86, 1.0) == pytest.approx(0.86)
    assert stats.gap_closed(0.86, 1.0, 0.825) == pytest.approx(0.2)
    assert stats.gap_closed(0.5, 0.6, 0.6) is None
    assert stats.gap_closed(0.06, 0.25, 0.44) is None  # the source is better: no gap to close


def test_mcnemar_exact():
    assert stats.mcnemar_p(0, 0) == 1.0
    assert stats.mcnemar_p(0, 5) == pytest.approx(2 / 32)
    assert stats.mcnemar_p(3, 3) == 1.0


def test_summarize_paired_differences_and_intervals():
    scores = {
        "target": [1, 1, 1, 1, 0, 1, 1, 1],
        "source": [0, 1, 0, 0, 0, 1, 0, 0],
        "transferred": [1, 1, 0, 1, 0, 1, 0, 1],
        "no_context": [0] * 8,
    }
    s = stats.summarize(scores, floor=0.0, bootstrap=500, seed=1)
    assert s["n"] == 8 and s["conditions"]["transferred"]["accuracy"] == 5 / 8
    assert s["retention"]["value"] == pytest.approx((5 / 8) / (7 / 8))
    assert s["gap_closed"]["value"] == pytest.approx((5 / 8 - 2 / 8) / (7 / 8 - 2 / 8))
    lo, hi = s["retention"]["ci"]
    assert lo <= s["retention"]["value"] <= hi
    d = s["paired"]["transferred-target"]
    assert d["diff"] == pytest.approx(-2 / 8) and (d["a_only"], d["b_only"]) == (0, 2)
    assert d["mcnemar_p"] == pytest.approx(0.5)
    assert d["ci"][0] <= d["diff"] <= d["ci"][1]
    assert s["paired"]["transferred-no_context"]["diff"] == pytest.approx(5 / 8)
