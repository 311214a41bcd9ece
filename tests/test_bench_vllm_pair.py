"""bench/bench_vllm_pair.py without vLLM: reading vLLM's flat prompt log-probs into full rows, the gap /
top-1 / KL summary and the report (the run itself needs .venv-vllm and the Qwen pair)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_vllm_pair.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_vllm_pair", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass
class Flat:
    """The fields of vLLM's ``FlatLogprobs`` the bench reads."""

    start_indices: list = field(default_factory=list)
    end_indices: list = field(default_factory=list)
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)

    def append(self, row: dict | None) -> None:
        self.start_indices.append(len(self.logprobs))
        for t, lp in (row or {}).items():
            self.token_ids.append(t)
            self.logprobs.append(lp)
        self.end_indices.append(len(self.logprobs))


def test_dense_rows_reads_the_asked_positions_and_refuses_a_partial_vocabulary():
    b = _bench()
    rng = np.random.default_rng(0)
    rows = b.log_softmax(rng.normal(size=(4, 6)))
    flat = Flat()
    flat.append(None)  # vLLM: no log-probs for the first prompt token
    for r in rows:  # the prompt token first (a duplicate of one in the full list), then every id
        flat.append({2: r[2], **{i: r[i] for i in range(6)}})
    got = b.dense_rows(flat, [2, 4], 6)
    assert np.array_equal(got, rows[[1, 3]])
    short = Flat()
    short.append(None)
    short.append({i: rows[0, i] for i in range(5)})
    with pytest.raises(RuntimeError, match="fewer log-probs than the vocabulary"):
        b.dense_rows(short, [1], 6)


def test_summary_puts_native_at_one_and_no_prefix_at_zero():
    b = _bench()
    rng = np.random.default_rng(1)
    per = {c: b.log_softmax(rng.normal(size=(5, 3, 8))) for c in ("native", "no_prefix", "x")}
    per["native"][..., 0] += 3  # native puts more mass on the real token (id 0) than no_prefix
    per = {c: b.log_softmax(v) for c, v in per.items()}
    targets = np.zeros((5, 3), dtype=np.int64)
    res = b.summarize(per, targets, np.random.default_rng(0), 50)
    assert res["native"]["gap_recovered"] == pytest.approx(1.0) and res["native"]["kl_mean"] == pytest.approx(0)
    assert res["no_prefix"]["gap_recovered"] == pytest.approx(0.0)
    assert res["native"]["top1_agreement"] == 1.0 and res["x"]["kl_mean"] > 0
