"""kvbridge.harness.pair_run: the checks before any model, and the one call on a loaded pair."""

from __future__ import annotations

import json

import pytest

from kvbridge.errors import KVBridgeError
from kvbridge.harness.pair_run import harness_pair, prepare
from kvbridge.harness.settings import HarnessSettings


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(tasks=("nope",)), "unknown task 'nope'"),
        (dict(tasks=("humaneval",)), "code execution is not allowed"),
        (dict(tasks=("recall",), mapping="/no/such/mapping"), "not a mapping folder"),
        (dict(tasks=("recall",), task_options=("lm-eval:x.num_fewshot=2",)), "which is not an --lm-eval-task"),
    ],
)
def test_prepare_refuses_before_any_model(kwargs, needle):
    with pytest.raises(KVBridgeError) as err:  # HarnessError, or the registry's PluginError for a name
        prepare(HarnessSettings(**{"mapping": "identity", **kwargs}))
    assert needle in str(err.value)


def test_one_call_on_a_loaded_pair_writes_the_report_and_removes_the_partial_file(tmp_path):
    from kvbridge.models.pair import load_pair

    pair = load_pair("zoo:base", "zoo:base")
    report = tmp_path / "rep"
    settings = HarnessSettings(
        mapping="identity",
        tasks=("recall",),
        limit=2,
        bootstrap=10,
        task_options=("recall.lengths=48", "recall.positions=0.5", "recall.n=2"),
        report_dir=str(report),
    )
    result, written = harness_pair(pair, settings)
    assert set(written) and all(p.exists() for p in written.values())
    assert json.loads((report / "harness.json").read_text())["tasks"] == json.loads(json.dumps(result["tasks"]))
    assert not (tmp_path / "rep.partial.jsonl").exists()
    assert {"target", "transferred"} <= set(result["conditions"])
