"""The recall task: contexts of the asked length, the fact at the asked position, the answer only in
the context, deterministic by seed, exact-match scoring."""

from __future__ import annotations

import pytest

from kvbridge.harness.tasks.recall import RecallOptions, RecallTask


def test_items_follow_lengths_positions_and_seed(base):
    _, tok = base
    task = RecallTask()
    opts = RecallOptions(lengths="64,160", positions="0,0.5,1", n=2, seed=3)
    items = task.items(opts, tok)
    assert len(items) == 2 * 3 * 2 and len({i.id for i in items}) == len(items)
    for item in items:
        n = len(tok(item.context, add_special_tokens=False)["input_ids"])
        length, pos = item.meta["length"], item.meta["position"]
        assert length - 30 <= n <= length + 30, (n, length)  # within about one fact of the target length
        assert item.meta["index"] == round(pos * (item.meta["facts"] - 1))
        assert f"is {item.answer}." in item.context and item.answer not in item.query
        assert item.group == f"len={length} pos={pos:.2f}"
    assert [i.context for i in task.items(opts, tok)] == [i.context for i in items]
    other = task.items(RecallOptions(lengths="64", positions="0.5", n=1, seed=4), tok)
    assert other[0].context != items[2].context


def test_exact_match_and_chance():
    task = RecallTask()
    item = task.items(RecallOptions(lengths="64", positions="0.5", n=1), _ByteTok())[0]
    assert task.score(item, f" {item.answer}") == 1.0
    assert task.score(item, f" {item.answer}1") == 0.0 and task.score(item, " none") == 0.0
    assert task.chance(item) < 1e-4


def test_bad_options_are_refused():
    from kvbridge.harness.protocol import HarnessError

    with pytest.raises(HarnessError, match="at least 32 tokens"):
        RecallTask().items(RecallOptions(lengths="8"), _ByteTok())
    with pytest.raises(HarnessError, match="in \\[0, 1\\]"):
        RecallTask().items(RecallOptions(positions="1.5"), _ByteTok())
    with pytest.raises(HarnessError, match="comma-separated list of numbers"):
        RecallTask().items(RecallOptions(lengths="long"), _ByteTok())


class _ByteTok:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(text.encode())}
