"""kvbridge.harness.settings: the CLI's defaults, one-line refusals, normalised name lists."""

from __future__ import annotations

import dataclasses

import pytest

from kvbridge.harness.protocol import HarnessError
from kvbridge.harness.settings import HarnessSettings

#: the CLI group's context settings: a command parsed on its own must not cache another help option
#: (click keeps the first one it builds on the command; CLI.md then shows "--help" without "-h")
HELP = {"help_option_names": ["-h", "--help"]}

#: click parameter name -> settings field (dtype, threads, --json are loading and printing)
CLI_TO_FIELD = {
    "mapping_ref": "mapping",
    "task_names": "tasks",
    "task_options": "task_options",
    "lm_eval_tasks": "lm_eval_tasks",
    "lm_eval_include": "lm_eval_include",
    "conditions": "conditions",
    "recompute_layers": "recompute_layers",
    "recompute_tokens": "recompute_tokens",
    "frontier": "frontier",
    "sink": "sink",
    "limit": "limit",
    "allow_code_execution": "allow_code_execution",
    "bootstrap": "bootstrap",
    "seed": "seed",
    "report_dir": "report_dir",
    "partial_path": "partial_path",
    "accept_mismatch": "accept_fingerprint_mismatch",
}


def test_every_click_default_is_the_dataclass_default():
    from kvbridge.cli.harness_cmd import harness

    ctx = harness.make_context("harness", ["S", "T", "--mapping", "m", "--tasks", "recall"], **HELP)
    parsed = HarnessSettings(**{field: ctx.params[name] for name, field in CLI_TO_FIELD.items()})
    assert parsed == HarnessSettings(mapping="m", tasks=("recall",))
    assert set(CLI_TO_FIELD.values()) == {f.name for f in dataclasses.fields(HarnessSettings)}


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
