"""``kvbridge eval`` end to end on the zoo's base model (identity mapping), and its exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner


@pytest.fixture(scope="module")
def corpus(base, tmp_path_factory):
    """A small text file written by the model itself (no corpus needed)."""
    from kvbridge.evaluate import model_samples

    model, tok = base
    ids = model_samples(model, n=6, length=120, seed=21)
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("\n".join(tok.decode(row[1:]) for row in ids), encoding="utf-8")
    return path


def _run(*args):
    from kvbridge.cli.main import cli

    return CliRunner().invoke(
        cli,
        [
            "eval",
            "zoo:base",
            "zoo:base",
            "--mapping",
            "identity",
            "--samples",
            "4",
            "--prefix-len",
            "16",
            "--continuation-len",
            "4",
            "--greedy-tokens",
            "3",
            "--bootstrap",
            "50",
            "--heldout-fraction",
            "0.5",
            *args,
        ],
    )


def test_json_output_and_passing_gate(corpus):
    res = _run("--corpus", str(corpus), "--json", "--gate", "kl_p95=0.2", "--gate", "default")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    t = data["conditions"]["transferred"]
    assert t["kl_p95"] <= 1e-9 and t["gap_recovered_ci"] is not None and len(t["nll_ci"]) == 2
    assert data["data"]["kind"] == "corpus" and data["samples"] == 4
    tm = data["timing"]  # both speed-ups: without and with the source prefill a transfer needs
    want = tm["target_prefill_ms"] / (tm["source_prefill_ms"] + tm["transfer_ms"])
    assert tm["transfer_speedup_with_source_prefill"] == pytest.approx(want, rel=1e-6)
    assert tm["transfer_speedup_with_source_prefill"] < tm["transfer_speedup_vs_prefill"]
    assert all(g["enforced"] and g["passed"] for g in data["gates"])


def test_failing_gate_sets_exit_status(corpus, tmp_path):
    res = _run("--corpus", str(corpus), "--gate", "no_prefix.kl_mean<=0", "--report", str(tmp_path / "rep"))
    assert res.exit_code == 1, res.output
    assert "FAIL" in res.stdout and "gates FAILED: no_prefix.kl_mean<=0" in res.stderr
    assert "| native |" in (tmp_path / "rep" / "summary.md").read_text()
    assert (tmp_path / "rep" / "attention_cosine.png").is_file()


def test_table_and_bad_input(corpus):
    res = _run("--corpus", str(corpus), "--conditions", "native,transferred,no_prefix,zeroed")
    assert res.exit_code == 0, res.output
    assert "transferred" in res.stdout and "zeroed" in res.stdout and "shuffled" not in res.stdout
    assert "x counting the source prefill" in res.stdout
    bad = _run("--corpus", str(corpus), "--gate", "kl_p95 about 1")
    assert bad.exit_code == 2 and "cannot read gate" in bad.output
    unknown = _run("--corpus", str(corpus), "--conditions", "native,bogus")
    assert unknown.exit_code == 2 and "unknown condition 'bogus'" in unknown.output


def test_eval_is_listed_and_light():
    import subprocess
    import sys

    code = (
        "import sys; import kvbridge.cli.eval_cmd; assert 'torch' not in sys.modules; "
        "from kvbridge.builtin.commands import COMMANDS; assert 'eval' in COMMANDS"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_demo_zoo_section_smoke(tmp_path):
    from kvbridge.cli.main import cli

    res = CliRunner().invoke(
        cli,
        [
            "demo",
            "--skip-identity",
            "--skip-real",
            "--pairs",
            "tuned",
            "--samples",
            "6",
            "--tokens",
            "4096",
            "--bootstrap",
            "20",
            "--greedy-tokens",
            "2",
            "--no-identity-rows",
            "--report",
            str(tmp_path / "demo"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "base->tuned" in res.stdout and "gap_rec" in res.stdout
    for f in (
        "summary.md",
        "demo.json",
        "base-tuned/summary.md",
        "base-tuned/mapping_r2.png",
        "mappings/base-tuned/manifest.json",
    ):
        assert (tmp_path / "demo" / f).is_file(), f
