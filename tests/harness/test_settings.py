"""kvbridge.harness.settings: the CLI's defaults, one-line refusals, normalised name lists."""

from __future__ import annotations

import dataclasses

import pytest

from kvbridge.harness.protocol import HarnessError
from kvbridge.harness.settings import HarnessSettings

#: the CLI group's context settings: a command parsed on its own must not cache another help option
#: (click keeps the first one it builds on the command; CLI.md then shows "--help" without "-h")
HELP = {"help_option_names": ["-h", "--help"]}

#: the command's parameters that are not settings (loading and printing)
NOT_SETTINGS = {"source", "target", "dtype", "threads", "as_json"}


def test_the_command_options_are_the_settings_fields():
    """Generated from the settings: one option per field, the field's default when not given."""
    from kvbridge.cli.harness_cmd import harness
    from kvbridge.cli.options import settings_from

    ctx = harness.make_context("harness", ["S", "T", "--mapping", "m", "--tasks", "recall"], **HELP)
    params = {k: v for k, v in ctx.params.items() if k not in NOT_SETTINGS}
    assert set(params) == {f.name for f in dataclasses.fields(HarnessSettings)}
    with ctx:
        assert settings_from(HarnessSettings, ctx.params) == HarnessSettings(mapping="m", tasks=("recall",))
    flags = {o for p in harness.params for o in p.opts}
    assert {"--mapping", "-o", "--task-option", "--lm-eval-task", "--report", "--partial", "--seed"} <= flags


def test_name_lists_are_normalised_and_the_partial_file_follows_the_report():
    s = HarnessSettings(
        mapping="identity", tasks="recall, mc,", conditions=" target,transferred ", report_dir="out/rep/"
    )
    assert s.tasks == ("recall", "mc") and s.conditions == ("target", "transferred")
    assert s.partial_file == "out/rep.partial.jsonl"
    assert HarnessSettings(mapping="identity", tasks=("recall",), partial_path="p.jsonl").partial_file == "p.jsonl"
    assert HarnessSettings(mapping="identity", tasks=("recall",)).partial_file is None


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(tasks=()), "no tasks given"),
        (dict(mapping=" "), "--mapping is empty"),
        (dict(limit=-1), "--limit must be a whole number >= 0"),
        (dict(bootstrap=1.5), "--bootstrap must be a whole number >= 0"),
        (dict(seed=True), "--seed must be a whole number >= 0"),
        (dict(tasks=3), "--tasks must be names"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_option(kwargs, needle):
    with pytest.raises(HarnessError) as err:
        HarnessSettings(**{"mapping": "identity", "tasks": ("recall",), **kwargs})
    assert needle in str(err.value) and "\n" not in str(err.value)
