"""manifests/results: kvbridge's own measured verdicts per pair, checked against RESULTS.md and shown
by `check` and `fit --plan` for that pair (and only that pair)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvbridge.check import measured as M
from kvbridge.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "manifests" / "schemas" / "measured-result.schema.json").read_text())


def _section(results: str) -> str:
    """The RESULTS.md section a record names (``RESULTS.md, section 'TITLE'``), up to the next heading."""
    title = re.search(r"section '([^']+)'", results).group(1)
    text = (REPO / "RESULTS.md").read_text(encoding="utf-8")
    start = re.search(rf"^##+ {re.escape(title)}\n", text, re.M).end()
    end = re.compile(r"^##+ ", re.M).search(text, start)  # (a bash comment in a code block is one #)
    return text[start : end.start() if end else None]


def test_the_reader_and_the_schema_agree_on_the_fields():
    assert set(SCHEMA["properties"]) == M.RECORD_KEYS
    assert set(SCHEMA["properties"]["measurements"]["items"]["properties"]) == M.MEASUREMENT_KEYS


def test_every_record_quotes_results_md_with_the_source_alone_beside_it():
    records = M.load_records()
    assert records, "no measured results under manifests/results/"
    for raw, rec in records:
        assert _section(rec.results)
        for m in rec.measurements:
            section = _section(m.get("results", rec.results))
            for key in ("transferred", "source_alone"):  # each number is in the section it cites
                assert f"{m[key]:.3f}" in section, (rec.path, m["metric"], key, m[key])
            written = _section(rec.results) + section  # the command as RESULTS.md writes it beside the numbers
            flags = [w for w in m["command"].split() if w.startswith("--")]
            assert flags and all(f in written for f in flags), (m["metric"], [f for f in flags if f not in written])


def test_the_qwen_pair_verdict_is_below_the_source_alone():
    (rec,) = M.measured_for({"qwen2.5-coder-0.5b"}, {"QWEN2.5-CODER-1.5B"})
    assert {m["metric"].split()[0] for m in rec.measurements} == {"NLL", "HumanEval", "in-context"}
    assert all(m["transferred"] < m["source_alone"] for m in rec.measurements)
    assert M.measured_for({"qwen2.5-coder-1.5b"}, {"qwen2.5-coder-0.5b"}) == []  # a direction is a pair
    assert M.measured_for({"zoo:base"}, {"zoo:tuned"}) == []


def _record(tmp_path, **changes):
    rec = {
        "source": {"names": ["zoo:base"]},
        "target": {"names": ["zoo:tuned"]},
        "verdict": "a test verdict",
        "summary": "what a test measured",
        "results": "RESULTS.md, section 'nowhere'",
        "measurements": [{"metric": "gap", "transferred": 0.25, "source_alone": 0.75, "command": "kvbridge eval x"}],
        **changes,
    }
    (tmp_path / "zoo.json").write_text(json.dumps(rec))
    return tmp_path


def test_check_and_the_fit_plan_show_the_record_of_their_pair(tmp_path, monkeypatch):
    from kvbridge.cli.main import cli

    monkeypatch.setattr(M, "REPO_RESULTS", _record(tmp_path))
    res = CliRunner().invoke(cli, ["check", "zoo:base", "zoo:tuned"])
    assert res.exit_code == 0, res.output
    assert "measured by kvbridge on this pair: a test verdict" in res.output
    assert "gap: transferred 0.250 vs source alone 0.750" in res.output and "command: kvbridge eval x" in res.output
    data = json.loads(CliRunner().invoke(cli, ["check", "zoo:base", "zoo:tuned", "--json"]).output)
    assert data["measured"][0]["measurements"][0]["command"] == "kvbridge eval x"
    other = json.loads(CliRunner().invoke(cli, ["check", "zoo:base", "zoo:wide", "--json"]).output)
    assert other["measured"] == []
    plan = CliRunner().invoke(cli, ["fit", "zoo:base", "zoo:tuned", "--plan"])
    assert plan.exit_code == 0 and "measured by kvbridge on this pair: a test verdict" in plan.output


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"measurements": [{"metric": "gap", "transferred": 0.2, "source_alone": 0.7}]}, "command"),
        ({"measurements": [{"metric": "gap", "transferred": "high", "source_alone": 0.7, "command": "x"}]}, "number"),
        ({"source": {"names": []}}, "source.names"),
        ({"retention": 0.9}, "unknown field 'retention'"),
    ],
)
def test_a_bad_record_is_one_line_naming_the_field(tmp_path, changes, needle):
    with pytest.raises(ConfigError) as err:
        M.load_records(_record(tmp_path, **changes))
    assert needle in str(err.value) and "\n" not in str(err.value)
