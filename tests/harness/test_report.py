"""harness/report.py: the report folder without matplotlib."""

import json

from kvbridge.evaluate import report as eval_report
from kvbridge.harness import report


def test_report_without_matplotlib_writes_no_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_report, "pyplot", lambda: None)
    monkeypatch.setattr(report, "markdown", lambda result: "summary\n")
    result = {"conditions": ["target"], "tasks": {"recall": {"conditions": {"target": {"accuracy": 0.5}}}}}
    assert report.plot(result, tmp_path / "a.png") is False and not (tmp_path / "a.png").exists()
    names = report.write_report(result, tmp_path / "rep")
    assert sorted(names) == ["harness.json", "summary.md"]
    assert all(path.is_file() for path in names.values())
    assert json.loads((tmp_path / "rep" / "harness.json").read_text()) == result
    assert not (tmp_path / "rep" / "accuracy.png").exists()
