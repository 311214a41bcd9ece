"""The built-in steering methods pass the steering-method contract (kvbridge.testing)."""

from __future__ import annotations

from kvbridge.steer.methods import ActAddMethod, BankMethod, MixMethod, ScaleMethod, VectorMethod
from kvbridge.testing import SteeringMethodContract


class TestVectorMethod(SteeringMethodContract):
    method = VectorMethod
    options = {"ck": 1.0, "cv": 2.0}


class TestScaleMethod(SteeringMethodContract):
    method = ScaleMethod
    options = {"ck": 1.5, "cv": 0.5}


class TestMixMethod(SteeringMethodContract):
    method = MixMethod
    options = {"alpha": 0.5}
    layers = "1-2"


class TestBankMethod(SteeringMethodContract):
    method = BankMethod
    options = {}
    layers = "0-1"  # the bank stays visible at layers 0-1 and is masked at 2-3


class TestActAddMethod(SteeringMethodContract):
    method = ActAddMethod
    options = {"coefficient": 2.0}


def test_a_method_that_changes_nothing_fails_the_contract():
    import pytest

    from kvbridge.steer.methods import SteerPlan
    from kvbridge.testing.steer_contract import check_method

    class Noop:
        """does nothing"""

        name = "noop-contract"
        Options = ScaleMethod.Options

        def plan(self, ctx, options):
            return SteerPlan(ctx.state)

    with pytest.raises(AssertionError, match="unchanged"):
        check_method(Noop, {"ck": 2.0})


def test_a_method_whose_neutral_options_change_the_run_fails_the_contract():
    import pytest

    from kvbridge.testing.steer_contract import check_method

    class Lying(ScaleMethod):
        """claims 2.0 is neutral"""

        name = "lying-contract"
        neutral = {"ck": 2.0, "cv": 2.0}

    with pytest.raises(AssertionError, match="neutral"):
        check_method(Lying, {"ck": 2.0})


def test_a_method_that_modifies_its_input_fails_the_contract():
    import pytest

    from kvbridge.steer.methods import SteerPlan
    from kvbridge.testing.steer_contract import check_method, steer_fixture

    class InPlace:
        """edits the given state in place"""

        name = "inplace-contract"
        Options = ScaleMethod.Options

        def plan(self, ctx, options):
            ctx.state.values[0].mul_(options.cv)
            return SteerPlan(ctx.state)

    try:
        with pytest.raises(AssertionError, match="modified the input"):
            check_method(InPlace, {"cv": 2.0})
    finally:
        steer_fixture.cache_clear()  # the fixture's state was changed in place: rebuild it
