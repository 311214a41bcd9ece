"""Gates (PASS/FAIL, exit codes), the metrics plugin, and the report folder."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvbridge.evaluate.gates import (
    DEFAULT_GATES,
    GATE_FAILED_EXIT,
    GateError,
    evaluate_gates,
    exit_code,
    gate_set,
    parse_gate,
)

HIB = {"kl_p95": False, "attention_cosine_min": True, "gap_recovered": True, "nll": False}


def test_parse_gate_forms():
    (g,) = parse_gate("kl_p95=0.2", HIB)
    assert (g.condition, g.metric, g.op, g.threshold) == ("transferred", "kl_p95", "<=", 0.2)
    (g,) = parse_gate("attention_cosine_min=0.9", HIB)
    assert g.op == ">="  # '=' means 'at least as good as'
    (g,) = parse_gate("zeroed.gap_recovered < 1e-1", HIB)
    assert (g.condition, g.op, g.threshold) == ("zeroed", "<", 0.1)
    assert [x.metric for x in parse_gate("default", HIB)] == ["kl_p95", "attention_cosine_min"]
    with pytest.raises(GateError, match="cannot read gate"):
        parse_gate("kl_p95 about 3", HIB)
    with pytest.raises(GateError, match="did you mean kl_p95"):
        parse_gate("kl_p59=0.2", HIB)


def test_gate_set_reports_defaults_and_enforces_given():
    gates = gate_set(["kl_p95=0.5", "gap_recovered>=0.8"], HIB)
    by = {g.metric: g for g in gates}
    assert not by["attention_cosine_min"].enforced  # default: reported only
    assert by["kl_p95"].enforced and by["kl_p95"].threshold == 0.5  # override of a default
    assert by["gap_recovered"].enforced
    assert len(DEFAULT_GATES) == 2


def _summary(kl, cos):
    return {"conditions": {"transferred": {"kl_p95": kl, "attention_cosine_min": cos}}}


def test_pass_fail_and_exit_codes():
    reported = evaluate_gates(_summary(0.5, 0.5), gate_set([], HIB))
    assert [r["passed"] for r in reported] == [False, False]
    assert exit_code(reported) == 0  # failing but not enforced
    enforced = evaluate_gates(_summary(0.1, 0.95), gate_set(["default"], HIB))
    assert all(r["passed"] for r in enforced) and exit_code(enforced) == 0
    failing = evaluate_gates(_summary(0.3, 0.95), gate_set(["default"], HIB))
    assert [r["passed"] for r in failing] == [False, True] and exit_code(failing) == GATE_FAILED_EXIT
    missing = evaluate_gates({"conditions": {"transferred": {"kl_p95": None}}}, gate_set(["kl_p95=1"], HIB))
    assert not missing[0]["passed"]  # a metric that does not apply fails its gate


def test_builtin_metrics_plugin_is_light_and_registers(host):
    code = (
        "import sys, kvbridge.builtin.metrics as m; assert 'torch' not in sys.modules, 'torch imported'; "
        "print(len(m.METRICS))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    names = host.registry("metric").names()
    for m in ("nll", "kl_mean", "kl_p95", "top1_agreement", "gap_recovered", "attention_cosine_min", "retention"):
        assert m in names
    assert host.registry("metric").owner["nll"] == "kvbridge.builtin.metrics"


def test_a_plugin_metric_is_computed(base, samples, monkeypatch):
    import types
    import kvbridge.builtin.metrics as builtin
    from kvbridge.builtin.identity import IdentityMapping
    from kvbridge.evaluate import evaluate
    from kvbridge.hookspecs import hookimpl
    from kvbridge.plugin_types import Metric
    from kvbridge.plugins import make_host

    class Plugin:
        @staticmethod
        @hookimpl
        def kvbridge_register_metrics(register):
            register(Metric("worst_nll", "max per-position nll", "kvb_test_metrics:worst_nll", False))

    module = types.ModuleType("kvb_test_metrics")
    module.worst_nll = worst_nll
    monkeypatch.setitem(sys.modules, "kvb_test_metrics", module)

    extra = [("myplugin", Plugin)]
    if "kvbridge.builtin.metrics" not in {r.name for r in make_host(entry_points=False).records}:
        extra.insert(0, ("kvbridge.builtin.metrics", builtin))
    h = make_host(entry_points=False, extra=extra)
    res = evaluate(
        base[0],
        base[0],
        IdentityMapping(),
        samples[:4],
        prefix_len=16,
        continuation_len=4,
        greedy_tokens=2,
        bootstrap=20,
        host=h,
        conditions=("native", "transferred", "no_prefix"),
        gates=["worst_nll<=100"],
    )
    row = res["conditions"]["no_prefix"]
    assert row["worst_nll"] > row["nll"] and len(row["worst_nll_ci"]) == 2
    assert res["gates"][-1]["metric"] == "worst_nll" and res["gates"][-1]["passed"]


def worst_nll(view):
    """A metric that returns one number (no replicate dimension): called per replicate."""
    return float(view["nll"].max())


def test_report_folder(identity_result, tmp_path):
    from kvbridge.evaluate.report import terminal_table, write_report

    res = dict(identity_result)
    res["mapping"] = dict(
        res["mapping"],
        heldout_r2={"k": [[0.9, 0.8]] * 4, "v": [[0.7, 0.95]] * 4},
        r2_summary={"mean": 0.84, "mean_k": 0.85, "mean_v": 0.83, "min": 0.7},
    )
    written = write_report(res, tmp_path / "rep")
    for name in ("summary.md", "eval.json", "attention_cosine.png", "gap_recovered.png", "mapping_r2.png"):
        f = tmp_path / "rep" / name
        assert f.is_file() and f.stat().st_size > 100, name
    assert (tmp_path / "rep" / "attention_cosine.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert "| transferred |" in md and "## Gates" in md and "![attention cosine per layer]" in md
    assert set(written) >= {"json", "markdown", "attention_cosine", "gap_recovered", "mapping_r2"}
    table = terminal_table(identity_result)
    assert "no_rope_reapply" in table and "PASS" in table
