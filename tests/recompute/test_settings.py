"""kvbridge.recompute.settings: the graft's settings (their checks are the CLI's) and the list parsing."""

from __future__ import annotations

import pytest

from kvbridge.errors import KVBridgeError
from kvbridge.recompute.settings import GraftRunSettings, GraftSettings, RecomputeError, parse_ratio, split_list


def test_graft_settings_parse_shares_and_controls():
    s = GraftSettings(ratios="30%, 5%,0.05,100%", controls="random,first")
    assert s.ratio_values == (0.05, 0.3, 1.0) and s.control_names == ("random", "first")
    assert GraftSettings(ratios=(0.25, 1.0)).ratio_values == (0.25, 1.0)  # the Python form
    assert GraftSettings(context_len=3, chunk_len=4, continuation_len=5).sample_len == 13


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"controls": "random,nope"}, "unknown control 'nope'"),
        ({"ratios": "150%"}, "outside 0..100%"),
        ({"ratios": "x"}, "bad token ratio"),
        ({"samples": 1}, "--samples"),
        ({"check_layer": -1}, "--check-layer"),
    ],
)
def test_bad_graft_settings_are_refused_naming_the_option(kw, needle):
    with pytest.raises(KVBridgeError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        GraftSettings(**kw)


def test_graft_run_needs_exactly_one_chunk():
    assert GraftRunSettings(context="a", chunk="b", prompt="c", ratio="15%").ratio == pytest.approx(0.15)
    for kw in ({}, {"chunk": "b", "pack_dir": "p"}):
        with pytest.raises(KVBridgeError, match="exactly one of --chunk and --pack"):
            GraftRunSettings(context="a", prompt="c", **kw)


def test_lists_and_ratios():
    assert split_list(" a, b,,c ") == ["a", "b", "c"] and split_list(("x", " y")) == ["x", "y"]
    assert parse_ratio("15%") == pytest.approx(0.15) and parse_ratio(0.5) == 0.5
    with pytest.raises(RecomputeError):
        parse_ratio("-1%")
