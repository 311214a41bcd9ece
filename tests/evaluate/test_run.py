"""kvbridge.evaluate.run: ``kvbridge eval`` as one library call on a loaded pair."""

from __future__ import annotations

import json

import pytest

from kvbridge import api
from kvbridge.evaluate.settings import EvalSettings
from kvbridge.errors import KVBridgeError

TEXT = (
    " ".join(
        f"the {w} king walks over the {v} hill and sings"
        for w in ("old", "lazy", "young", "tall")
        for v in ("green", "far", "red", "cold")
    )
    * 6
)


@pytest.fixture(scope="module")
def pair():
    return api.load_pair("zoo:base", "zoo:base")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("evalrun") / "corpus.txt"
    path.write_text(TEXT)
    return str(path)


def small(corpus, **kw):
    base = dict(
        mapping="identity",
        corpus=corpus,
        samples=4,
        prefix_len=8,
        continuation_len=3,
        greedy_tokens=3,
        bootstrap=0,
        batch_size=4,
        heldout_fraction=0.5,
    )
    return EvalSettings(**{**base, **kw})


def test_identity_eval_is_exact_and_reports_progress(pair, corpus, tmp_path):
    seen = []
    run = api.evaluate_pair(
        pair,
        small(corpus, conditions="native,transferred", report_dir=str(tmp_path / "rep")),
        progress=lambda done, total: seen.append((done, total)),
    )
    assert not run.recompute and run.exit_code == 0 and run.failed_gates == []
    assert run.result["conditions"]["transferred"]["kl_mean"] < 1e-6
    assert seen and seen[-1][0] == seen[-1][1] == 4
    assert set(run.written) and (tmp_path / "rep" / "eval.json").is_file()
    assert not (tmp_path / "rep.partial.jsonl").exists()  # the report holds everything
    assert json.loads((tmp_path / "rep" / "eval.json").read_text())["conditions"]


def test_the_partial_log_is_finished(pair, corpus, tmp_path):
    path = tmp_path / "p.jsonl"
    api.evaluate_pair(pair, small(corpus, conditions="native", partial_path=str(path)))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["command"] == "eval" and lines[0]["source"] == "zoo:base" and lines[-1]["record"] == "summary"


def test_a_bad_mapping_is_refused(pair, corpus, tmp_path):
    with pytest.raises(KVBridgeError):
        api.evaluate_pair(pair, small(corpus, mapping=str(tmp_path / "missing")))


def test_the_frontier_runs_as_a_recompute_condition_set(pair, corpus):
    """``--frontier`` is a condition set the recompute stage hands the eval runner: through the API it
    runs; the eval stage alone (no condition sets: it never imports recompute) refuses it by name."""
    from kvbridge.evaluate.run import evaluate_pair

    settings = small(corpus, frontier="0.5", sink=1)
    run = api.evaluate_pair(pair, settings)
    assert run.frontier and run.kind == "frontier" and run.exit_code == 0
    assert {"native", "tail@0.5", "truncated@0.5"} <= set(run.result["conditions"])
    with pytest.raises(KVBridgeError, match="recompute stage"):
        evaluate_pair(pair, settings)


def test_a_condition_set_keeps_a_named_partial_file_and_removes_its_own(pair, corpus, tmp_path):
    """A ``--partial`` file the user named is never deleted, also when a condition set wrote the
    report; the default ``REPORT.partial.jsonl`` goes once the report holds everything."""
    named = tmp_path / "mine.jsonl"
    run = api.evaluate_pair(
        pair, small(corpus, frontier="0.5", sink=1, report_dir=str(tmp_path / "a"), partial_path=str(named))
    )
    assert run.frontier and run.written and named.is_file()
    head = json.loads(named.read_text().splitlines()[0])
    assert head["command"] == "eval" and head["complete"] is True
    run = api.evaluate_pair(pair, small(corpus, frontier="0.5", sink=1, report_dir=str(tmp_path / "b")))
    assert run.frontier and run.written and not (tmp_path / "b.partial.jsonl").exists()
