"""Saved conformance results: rerun some rows and merge them into the published table and its JSON."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvbridge.cli.main import cli
from kvbridge.conformance import report, sweep

R = sweep.Result


def _saved(tmp_path, rows, version="5.24.0", name="supported-models.json"):
    path = tmp_path / name
    path.write_text(json.dumps(report.document(rows, transformers_version=version)))
    return path


BASE = [
    R("aaa", "exact", "generic", max_logit_diff=1e-7),
    R("bbb", "not-built", "", "KeyError: 'x'"),
    R("ccc", "refused", "", "no attention KV cache"),
]


def test_merge_replaces_only_the_given_rows():
    merged = report.merge(BASE, [R("bbb", "exact", "generic", max_logit_diff=2e-7), R("ddd", "refused", "", "why")])
    assert [(r.model_type, r.status) for r in merged] == [
        ("aaa", "exact"),
        ("bbb", "exact"),
        ("ccc", "refused"),
        ("ddd", "refused"),
    ]
    assert report.counts(merged)["exact"] == 2 and report.counts(merged)["not-built"] == 0


def test_cli_merge_from_file_rewrites_json_and_table(tmp_path):
    base = _saved(tmp_path, BASE)
    new = _saved(
        tmp_path,
        [R("bbb", "exact", "generic", max_logit_diff=2e-7), R("aaa", "wrong", "generic", "x")],
        name="new.json",
    )
    md = tmp_path / "supported-models.md"
    res = CliRunner().invoke(
        cli, ["conformance", "--from", str(new), "--types", "bbb", "--merge", str(base), "--markdown", str(md)]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(base.read_text())
    assert {r["model_type"]: r["status"] for r in doc["results"]} == {
        "aaa": "exact",
        "bbb": "exact",
        "ccc": "refused",
    }  # aaa not taken
    assert doc["summary"]["exact"] == 2 and doc["updates"] == [["bbb"]] and doc["transformers"] == "5.24.0"
    text = md.read_text()
    assert "**2 of 3 buildable model types exact (3 in the registry): 2 exact, 1 refused, 0 not-built" in text
    assert "| bbb | exact | generic |" in text and "`bbb`" in text and "--merge" in text
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_cli_merge_runs_the_given_types(tmp_path, monkeypatch):
    import transformers

    base = _saved(tmp_path, BASE, version=transformers.__version__)
    ran = []
    monkeypatch.setattr(sweep, "run", lambda types, progress=None: ran.append(types) or [R("ccc", "exact", "g")])
    monkeypatch.setattr(sweep, "all_types", lambda: ["aaa", "bbb", "ccc"])
    res = CliRunner().invoke(cli, ["conformance", "--types", "ccc", "--merge", str(base)])
    assert res.exit_code == 0, res.output
    assert ran == [["ccc"]] and "2 of 2 buildable" in res.output
    assert [r.status for r in report.load(base)] == ["exact", "not-built", "exact"]


def test_full_run_then_from_writes_the_json_beside_the_table(tmp_path):
    full = _saved(tmp_path, BASE, name="conformance.json")
    md = tmp_path / "table.md"
    res = CliRunner().invoke(cli, ["conformance", "--from", str(full), "--markdown", str(md)])
    assert res.exit_code == 0, res.output
    assert [r.model_type for r in report.load(tmp_path / "table.json")] == ["aaa", "bbb", "ccc"]
    assert "rerun with `--merge`" not in md.read_text()


@pytest.mark.parametrize(
    "args, what",
    [
        (["--types", "bbb"], "transformers 1.0"),  # a table of another transformers version
        ([], "none were given"),
    ],
)
def test_cli_merge_refuses_with_one_line(tmp_path, args, what):
    base = _saved(tmp_path, BASE, version="1.0")
    new = _saved(tmp_path, [R("bbb", "exact", "g")], name="new.json", version="5.24.0")
    cmd = ["conformance", "--merge", str(base)] + (["--from", str(new)] + args if args else [])
    res = CliRunner().invoke(cli, cmd)
    assert res.exit_code == 2 and what in res.output and "Traceback" not in res.output
    assert report.load_doc(base)["transformers"] == "1.0"  # untouched


def test_a_file_that_is_not_results_is_a_one_line_error(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"models": []}')
    res = CliRunner().invoke(cli, ["conformance", "--from", str(bad)])
    assert res.exit_code == 2 and "not conformance results" in res.output
