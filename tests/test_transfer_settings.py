"""kvbridge.transfer_settings: defaults are the CLI's, bad values are one-line ConfigErrors."""

from __future__ import annotations

import dataclasses

import pytest

from kvbridge.errors import ConfigError
from kvbridge.transfer_settings import TransferSettings

#: the CLI group's context settings: a command parsed on its own must not cache another help option
#: (click keeps the first one it builds on the command; CLI.md then shows "--help" without "-h")
HELP = {"help_option_names": ["-h", "--help"]}


def test_every_click_default_is_the_dataclass_default():
    """The command's options are generated from the settings: its parsed defaults (only the required
    options given) build the default settings."""
    from kvbridge.cli.options import settings_from
    from kvbridge.cli.transfer_cmd import transfer

    ctx = transfer.make_context("transfer", ["S", "T", "--mapping", "m", "--prompt", "p"], **HELP)
    params = {k: v for k, v in ctx.params.items() if k not in ("source", "target", "dtype")}
    assert set(params) == {f.name for f in dataclasses.fields(TransferSettings)}
    with ctx:
        assert settings_from(TransferSettings, params) == TransferSettings(mapping="m", prompt="p")


def test_defaults():
    s = TransferSettings(mapping="identity", prompt="hi there")
    assert (s.max_new_tokens, s.compare, s.engine, s.accept_fingerprint_mismatch) == (32, False, None, False)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(max_new_tokens=0), "--max-new-tokens must be a whole number >= 1"),
        (dict(max_new_tokens=True), "--max-new-tokens must be a whole number >= 1"),
        (dict(max_new_tokens=2.5), "--max-new-tokens must be a whole number >= 1"),
        (dict(mapping=""), "--mapping is empty"),
        (dict(prompt=None), "--prompt must be text"),
        (dict(engine=" "), "--engine is empty"),
    ],
)
def test_bad_values_are_refused_naming_the_option(kwargs, needle):
    base = dict(mapping="identity", prompt="hi there")
    with pytest.raises(ConfigError) as err:
        TransferSettings(**{**base, **kwargs})
    assert needle in str(err.value) and "(fix: " in str(err.value) and "\n" not in str(err.value)


def test_frozen():
    s = TransferSettings(mapping="identity", prompt="x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.prompt = "y"
