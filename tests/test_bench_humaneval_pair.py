"""bench/bench_humaneval_pair.py: its greedy loop (the harness's, on any engine), the resumable
records file and the summary (pass@1, retention beside the gap closed, paired differences)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_humaneval_pair.py"


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("bench_humaneval_pair", BENCH)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def one_hot(i, n=8):
    x = np.zeros(n, dtype=np.float32)
    x[i] = 1.0
    return x


def run(mod, script, **kw):
    """Greedy over a scripted engine: token t is followed by script[t]; id 0 is EOS; id k decodes to letter k."""
    fed = []

    def step(t):
        fed.append(t)
        return one_hot(script[t])

    text, n = mod.greedy_completion(
        step, one_hot(1), lambda ids: "".join("_abcdefg"[i] for i in ids), eos_ids={0}, **kw
    )
    return text, n, fed


def test_greedy_completion_stops_like_the_harness(mod):
    chain = {1: 2, 2: 3, 3: 4, 4: 0, 5: 5}
    assert run(mod, chain, stop=(), max_new_tokens=10) == ("abcd", 4, [1, 2, 3, 4])  # EOS ends it, not emitted
    assert run(mod, chain, stop=("bc",), max_new_tokens=10)[:2] == ("a", 3)  # cut at the stop string
    text, n, fed = run(mod, chain, stop=(), max_new_tokens=2)
    assert (text, n, fed) == ("ab", 2, [1])  # the last token is not fed back


def test_records_resume_and_summary(mod, tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [(1, 0, 1), (1, 1, 0), (0, 0, 0), (1, 0, 1), (1, 0, 0)]  # target, source, transferred
    lines = [json.dumps({"index": i, "passed": dict(zip(mod.CONDITIONS, map(bool, r)))}) for i, r in enumerate(rows)]
    path.write_text("\n".join(lines) + '\n{"index": 5, "pas', encoding="utf-8")  # a torn last line
    recs = mod.read_records(path)
    assert [r["index"] for r in recs] == [0, 1, 2, 3, 4]
    res = mod.summarize(list(reversed(recs)), bootstrap=50)
    t = res["tasks"]["humaneval"]
    acc = {c: t["conditions"][c]["accuracy"] for c in mod.CONDITIONS}
    assert acc == pytest.approx({"target": 0.8, "source": 0.2, "transferred": 0.4})
    assert t["retention"]["value"] == pytest.approx(0.5)
    assert t["gap_closed"]["value"] == pytest.approx((0.4 - 0.2) / (0.8 - 0.2))
    assert t["paired"]["transferred-target"]["b_only"] == 2 and res["problems"] == [0, 1, 2, 3, 4]
    assert mod.contiguous([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_records_merge_per_condition_and_the_summary_takes_the_problems_with_all(mod, tmp_path):
    path = tmp_path / "r.jsonl"
    old = {"index": 0, "passed": {"target": True, "source": False, "transferred": False}, "mapping": "m1"}
    lines = [old] + [{"index": i, "passed": dict(zip(mod.CONDITIONS, (True, True, False)))} for i in (1, 2)]
    lines += [
        {"index": 0, "passed": {"tail@0.1": True}, "mappings": {"tail@0.1": "m2"}},
        {"index": 0, "passed": {"truncated@0.1": False}},
        {"index": 1, "passed": {"tail@0.1": False}},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    recs = mod.read_records(path)
    assert [r["index"] for r in recs] == [0, 1, 2]
    assert recs[0]["passed"] == {
        "target": True,
        "source": False,
        "transferred": False,
        "tail@0.1": True,
        "truncated@0.1": False,
    }
    assert recs[0]["mappings"] == {"transferred": "m1", "tail@0.1": "m2"}
    both = mod.summarize(recs, conditions=["target", "source", "tail@0.1", "truncated@0.1"], bootstrap=20)
    assert both["problems"] == [0] and "tail@0.1-truncated@0.1" in both["tasks"]["humaneval"]["paired"]
    assert mod.summarize(recs, conditions=["target", "tail@0.1"], bootstrap=0)["problems"] == [0, 1]
    assert mod.summarize(recs, bootstrap=0)["problems"] == [0, 1, 2]


def test_condition_names_and_frontier_split(mod):
    assert mod.parse_conditions("target, tail@10%,truncated@0.25,transferred:best", {"best": "p"}) == [
        "target",
        "tail@0.1",
        "truncated@0.25",
        "transferred:best",
    ]
    for bad in ("tail@1.5", "transferred:other", "nope"):
        with pytest.raises(SystemExit, match="error: "):
            mod.parse_conditions(bad, {"best": "p"})
    # a prompt of 101 tokens: P = 100 cached, the last one live; k = ceil(R * P)
    assert mod.frontier_split("tail@0.1", 101, 4) == ("tail", 4, 90)
    assert mod.frontier_split("truncated@0.25", 101, 4) == ("truncated", 4, 75)
    assert mod.frontier_split("tail@0", 101, 4) == ("tail", 0, 100)  # the plain transfer
    assert mod.frontier_split("truncated@0", 101, 4) == ("truncated", 4, 100)  # the sinks and the live token
    assert mod.frontier_split("tail@1", 101, 4) == ("tail", 0, 0)  # the target's own prefill


def test_summary_says_where_the_time_went(mod, tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    ph = {"first": 1.5, "decode": 4.0, "score": 0.25}
    lines = [
        {"index": i, "passed": {c: True}, "tokens": {c: 3}, "seconds": {c: 6.0}, "phases": {c: ph}}
        for i in (0, 1)
        for c in mod.CONDITIONS
    ]
    lines.append({"index": 2, "passed": dict.fromkeys(mod.CONDITIONS, False)})  # an old record: no phases
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    assert mod.read_records(path)[1]["phases"] == dict.fromkeys(mod.CONDITIONS, ph)
    mod.print_summary(path, 0)
    out = capsys.readouterr().out
    assert "target 6 tokens in 12 s" in out
    assert "where it went (first logits / decode / test): target 3.0 / 8.0 / 0.5 s (2 problems)" in out
