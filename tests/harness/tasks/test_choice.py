"""Multiple choice from a local JSONL: parsing and one-line refusals naming file and line."""

from __future__ import annotations

import pytest

from kvbridge.harness.protocol import HarnessError
from kvbridge.harness.tasks.choice import ChoiceTask, read_items


def test_items(mc_file):
    items = read_items(str(mc_file))
    assert [i.gold for i in items] == [0, 1, 1] and items[2].id == "fruit"
    assert items[1].context.startswith("Tom has three apples.\nQuestion: ") and items[1].query == "Answer:"
    assert items[0].choices == (" blue", " green", " red")
    assert ChoiceTask().chance(items[0]) == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "is not JSON"),
        ('{"question": "q", "choices": ["a"], "answer": 0}', "two or more"),
        ('{"question": "q", "choices": ["a", "b"], "answer": 2}', "not one of its 2 choices"),
        ('{"question": "q", "choices": ["a", "b"], "answer": "c"}', "not one of its 2 choices"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_bad_lines(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "choices": ["a", "b"], "answer": 0}\n' + line + "\n")
    with pytest.raises(HarnessError, match=message) as info:
        read_items(str(path))
    assert f"{path}:2" in str(info.value) and "\n" not in str(info.value)


def test_missing_file():
    with pytest.raises(HarnessError, match="not found"):
        read_items("/no/such/file.jsonl")
    with pytest.raises(HarnessError, match="-o mc.path"):
        read_items("")
