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
