"""The fitter contract runs on every built-in fitter (and catches a broken one)."""

from __future__ import annotations

import pytest

from kvbridge.builtin.identity import IdentityFitter
from kvbridge.fit.headwise import HeadwiseFitter
from kvbridge.fit.ridge import RidgeFitter
from kvbridge.fit.sklearn_fitter import SklearnFitter
from kvbridge.testing import FitterContract
from kvbridge.testing.fitter_contract import check_recovers_planted, fit_planted, planted_fixture


class TestRidgeContract(FitterContract):
    fitter = RidgeFitter
    options = {"top_k": 2}


class TestHeadwiseContract(FitterContract):
    fitter = HeadwiseFitter


class TestSklearnContract(FitterContract):
    fitter = SklearnFitter
    options = {"top_k": 2}


class TestIdentityContract(FitterContract):
    fitter = IdentityFitter
    planted = {"kv_dup": 0}  # source == target: the planted map is the identity


def test_the_contract_fails_a_fitter_that_does_not_recover_the_map():
    """Control: ridge restricted to the wrong source layer cannot reproduce the target cache."""
    fixture = planted_fixture((1, 3), 2, 40)
    mapping, host = fit_planted(RidgeFitter, {"top_k": 1}, fixture)
    from dataclasses import replace

    wrong = replace(
        mapping, layers=[replace(lm, sources=((s + 1) % 4,)) for lm, s in zip(mapping.layers, fixture["truth"])]
    )
    with pytest.raises(AssertionError, match="differs from the target's own"):
        check_recovers_planted(wrong, host, fixture, min_r2=0.0)
