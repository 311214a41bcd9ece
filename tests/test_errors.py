"""The settings objects' shared checks: one-line errors that name the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbridge.errors import ConfigError, KVBridgeError, names_value, path_value, whole_number


def test_whole_number_refuses_bools_floats_and_small_values():
    whole_number(3, "--samples", 2)
    for bad in (True, 2.0, "3", 1):
        with pytest.raises(ConfigError, match="--samples"):
            whole_number(bad, "--samples", 2)


def test_names_value_parses_commas_and_sequences():
    assert names_value("a, b,,c", "--tasks") == ("a", "b", "c")
    assert names_value(["x", " y "], "--tasks") == ("x", "y")
    assert names_value(None, "--tasks") == ()


def test_names_value_raises_the_callers_error():
    class MyError(KVBridgeError):
        pass

    with pytest.raises(MyError, match="--arms must be names, got int"):
        names_value(3, "--arms", MyError)


def test_path_value():
    assert path_value(Path("a/b"), "--out") == "a/b"
    assert path_value(None, "--out") is None
    for bad in ("", "  ", 3):
        with pytest.raises(ConfigError, match="--out must be a path"):
            path_value(bad, "--out")
    with pytest.raises(ConfigError):
        path_value(None, "--out", required=True)


def test_did_you_mean_quotes_and_shows_spellings():
    from kvbridge.errors import did_you_mean

    assert did_you_mean("geometri", ["geometry", "family"]) == "did you mean geometry? "
    assert did_you_mean("geometri", ["geometry", "family"], n=1, quote=True) == "did you mean 'geometry'? "
    lowered = {"qwen/qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B", "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B"}
    assert did_you_mean("qwen2.5-0.5", lowered, shown=lowered) == "did you mean Qwen/Qwen2.5-0.5B? "
    assert did_you_mean("zzz", ["geometry"]) == ""
