"""kvbridge.fit.settings: the CLI's defaults, one-line refusals, top-k and option lists normalised."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvbridge.errors import ConfigError, KVBridgeError
from kvbridge.fit.settings import FitSettings, parse_top_k

#: the CLI group's context settings: a command parsed on its own must not cache another help option
#: (click keeps the first one it builds on the command; CLI.md then shows "--help" without "-h")
HELP = {"help_option_names": ["-h", "--help"]}

#: click parameter name -> settings field: the options are generated from the fields, so none is renamed
RENAMED: dict = {}


def _parse(args):
    from kvbridge.cli.fit_cmd import fit

    ctx = fit.make_context("fit", ["S", "T", *args], **HELP)
    params = {k: v for k, v in ctx.params.items() if k not in ("source", "target")}
    return FitSettings(**{RENAMED.get(k, k): v for k, v in params.items()}), params


def test_every_click_default_is_the_dataclass_default():
    parsed, params = _parse([])
    assert parsed == FitSettings()
    assert {RENAMED.get(k, k) for k in params} == {f.name for f in dataclasses.fields(FitSettings)}
    assert len(params) == 28


def test_parsed_values_reach_their_fields():
    parsed, _ = _parse(
        [
            "--corpus",
            "c.txt",
            "--out",
            "m",
            "-o",
            "low_r2=0.2",
            "--top-k",
            "1,2,all",
            "--alpha",
            "auto",
            "--memory",
            "0.5",
            "--plan",
            "--calibrate",
            "cpu",
            "--dtype",
            "bfloat16",
        ]
    )
    assert (parsed.corpus, parsed.out, parsed.fitter_options) == ("c.txt", "m", ("low_r2=0.2",))
    assert parsed.top_k == (1, 2, "all") and parsed.sweep
    assert (parsed.alpha, parsed.memory_gib, parsed.plan, parsed.plan_device, parsed.dtype) == (
        "auto",
        0.5,
        True,
        "cpu",
        "bfloat16",
    )


@pytest.mark.parametrize(
    "given, top_k",
    [
        (None, None),
        (4, 4),
        ("4", 4),
        ("all", "all"),
        (["all"], "all"),
        ([2], 2),
        ("1,2,all", (1, 2, "all")),
        ([1, 1, 2], (1, 2)),
    ],
)
def test_top_k_is_one_k_or_a_tuple(given, top_k):
    s = FitSettings(top_k=given)
    assert s.top_k == top_k and s.sweep == isinstance(top_k, tuple)
    hash(s)  # frozen and hashable: no lists inside


def test_options_and_paths_are_normalised():
    s = FitSettings(fitter_options={"top_k": 2, "alpha": "auto"}, corpus=Path("c.txt"), out=Path("m"))
    assert s.fitter_options == ("top_k=2", "alpha=auto") and (s.corpus, s.out) == ("c.txt", "m")
    assert FitSettings(fitter_options="top_k=2").fitter_options == ("top_k=2",)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(seq_len=1), "--seq-len must be an integer >= 2"),
        (dict(stride=0), "--stride must be"),
        (dict(stride=600), "--stride 600 is larger than the 512 positions"),
        (dict(skip=-1), "--skip must be an integer >= 0"),
        (dict(tokens=0), "--tokens"),
        (dict(alpha="lots"), "--alpha must be a number or 'auto'"),
        (dict(memory_gib=0), "--memory must be > 0"),
        (dict(top_k=0), "--top-k must be a whole number >= 1"),
        (dict(top_k="two"), "--top-k value 'two' is not a whole number"),
        (dict(top_k=True), "--top-k must be a whole number"),
        (dict(corpus_heldout=1.0), "--corpus-heldout must be a share in [0, 1)"),
        (dict(heldout=-0.1), "--heldout must be a share in [0, 1)"),
        (dict(batch_size=0), "--batch-size must be a whole number >= 1"),
        (dict(seed=-1), "--seed must be a whole number >= 0"),
        (dict(max_samples=0), "--max-samples must be a whole number >= 1"),
        (dict(device_flops=-1.0), "--device-flops must be > 0"),
        (dict(dtype="int8"), "--dtype 'int8' is not a dtype"),
        (dict(fitter=" "), "--fitter is empty"),
        (dict(corpus=""), "--corpus must be a path"),
        (dict(plan_device=""), "--calibrate is empty"),
        (dict(fitter_options=3), "-o must be KEY=VALUE strings"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_option(kwargs, needle):
    with pytest.raises(KVBridgeError) as err:  # ConfigError, or the validation layer's ValidationError
        FitSettings(**kwargs)
    assert needle in str(err.value) and "(fix: " in str(err.value) and "\n" not in str(err.value)


def test_parse_top_k():
    assert parse_top_k("1, 2,all") == [1, 2, "all"] and parse_top_k("3") == 3 and parse_top_k(None) is None
    with pytest.raises(ConfigError, match="--top-k is empty"):
        parse_top_k([])


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        FitSettings().seq_len = 4


def test_gram_dtype_is_a_ridge_option_with_two_choices():
    from kvbridge.fit.ridge import RidgeOptions
    from kvbridge.fit.solve import FitError

    assert RidgeOptions().gram_dtype == "float32" and RidgeOptions(gram_dtype="float64").gram_dtype == "float64"
    with pytest.raises(FitError, match=r"-o gram_dtype='float16' is not one of float32, float64"):
        RidgeOptions(gram_dtype="float16")
