"""kvbridge.steer.settings: one settings object per `steer` subcommand, the CLI's defaults, one-line refusals."""

from __future__ import annotations

import dataclasses

import pytest

from kvbridge.errors import KVBridgeError
from kvbridge.steer.settings import SteerBuildSettings, SteerEvalSettings, SteerRunSettings, SteerTransferSettings

#: the CLI group's context settings: a command parsed on its own must not cache another help option
#: (click keeps the first one it builds on the command; CLI.md then shows "--help" without "-h")
HELP = {"help_option_names": ["-h", "--help"]}
#: loading and printing, not settings (the model or pair is the other input)
NOT_SETTINGS = {"model", "source", "target", "dtype", "device", "as_json"}

#: subcommand -> (settings class, required arguments, click parameter -> field renames (none: the options
#: are generated from the fields), required fields)
CASES = {
    "build": (
        SteerBuildSettings,
        ["M", "--pairs", "p.jsonl", "--out", "v"],
        {},
        dict(pairs="p.jsonl", out="v"),
    ),
    "transfer": (
        SteerTransferSettings,
        ["v", "--mapping", "m", "--source", "S", "--target", "T", "--out", "o"],
        {},
        dict(vector="v", mapping="m", out="o"),
    ),
    "run": (SteerRunSettings, ["M", "--prompt", "hi"], {}, dict(prompt="hi")),
    "eval": (
        SteerEvalSettings,
        ["M", "--vector", "v", "--prompt", "hi", "--scorer", "bullets"],
        {},
        dict(vector="v", prompt="hi", scorer="bullets"),
    ),
}


#: settings the library's callers (benches, tests) set and the command leaves at their defaults
LIBRARY_ONLY = {"eval": {"sweep_arms", "random_seed", "bootstrap"}}


@pytest.mark.parametrize("name", list(CASES))
def test_every_click_default_is_the_dataclass_default(name):
    from kvbridge.cli.steer_cmd import steer

    cls, args, renamed, required = CASES[name]
    ctx = steer.commands[name].make_context(name, args, **HELP)
    params = {renamed.get(k, k): v for k, v in ctx.params.items() if k not in NOT_SETTINGS}
    assert cls(**params) == cls(**required)
    assert set(params) == {f.name for f in dataclasses.fields(cls)} - LIBRARY_ONLY.get(name, set())


def test_values_are_normalised():
    s = SteerEvalSettings(
        vector="v", prompt="p", scorer="bullets", arms="none, kv,", sweep="0.5,2", extra=["moved=vec/"]
    )
    assert s.arms == ("none", "kv") and s.sweep == (0.5, 2.0) and s.extra_vectors == {"moved": "vec/"}
    assert SteerRunSettings(prompt="p", options=["ck=1"]).options == ("ck=1",)
    hash(s)


@pytest.mark.parametrize(
    "cls, kwargs, needle",
    [
        (SteerRunSettings, dict(prompt="p", cv=float("nan")), "--cv must be a finite number, got nan"),
        (SteerRunSettings, dict(prompt="p", at="guide"), "--at guide needs --guide"),
        (SteerRunSettings, dict(prompt="p", at="pack"), "--at pack needs --pack"),
        (SteerRunSettings, dict(prompt="p", at="middle"), "--at must be one of last, guide, pack"),
        (SteerRunSettings, dict(prompt="p", max_new_tokens=0), "--max-new-tokens must be a whole number >= 1"),
        (SteerRunSettings, dict(prompt="p", temperature=0), "--temperature must be a finite number > 0, got 0"),
        (SteerRunSettings, dict(prompt="p", top_p=1.5), "--top-p must be a finite number > 0 and <= 1, got 1.5"),
        (SteerRunSettings, dict(prompt=None), "--prompt must be text"),
        (SteerRunSettings, dict(prompt="p", method=""), "--method is empty"),
        (SteerEvalSettings, dict(vector="v", prompt="p", scorer="s", sweep="1,nan"), "--sweep must be finite"),
        (
            SteerEvalSettings,
            dict(vector="v", prompt="p", scorer="s", samples=2, sweep_samples=3),
            "--sweep-samples exceeds --samples",
        ),
        (
            SteerEvalSettings,
            dict(vector="v", prompt="p", scorer="s", extra=["moved"]),
            "--extra 'moved' is not NAME=DIR",
        ),
        (SteerEvalSettings, dict(vector="v", prompt="p", scorer=" "), "--scorer is empty"),
        (SteerEvalSettings, dict(vector="v", prompt="p", scorer="s", at="guide"), "--at must be one of last, prompt"),
        (SteerBuildSettings, dict(pairs="p", out="o", method="median"), "--method must be one of mean, pca"),
        (SteerBuildSettings, dict(pairs="p", out=""), "--out must be a path"),
        (SteerTransferSettings, dict(vector="v", mapping=None, out="o"), "--mapping must be a path"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_option(cls, kwargs, needle):
    with pytest.raises(KVBridgeError) as err:
        cls(**kwargs)
    assert needle in str(err.value) and "(fix: " in str(err.value) and "\n" not in str(err.value)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SteerRunSettings(prompt="p").seed = 1
