"""The demo pipeline's sections and the real-model section's extension point (no model loaded)."""

from __future__ import annotations

from click.testing import CliRunner

from kvbridge.demo import DEFAULT_SECTIONS, SECTIONS
from kvbridge.demo import real


def test_sections_are_listed_in_order():
    assert list(SECTIONS) == ["identity", "zoo", "real", "adapter", "pair"]
    assert DEFAULT_SECTIONS == ("identity", "zoo", "real")  # the pair is opt-in


def test_a_part_added_to_the_real_section_runs_and_can_fail_it(monkeypatch):
    monkeypatch.setattr(real, "REAL_SECTIONS", list(real.REAL_SECTIONS))
    seen = []

    def adapter_pair(ctx):
        seen.append(ctx.ref)
        ctx.results["adapter_pair"] = {"rows": 0}
        ctx.ok = False

    real.add_real_section("adapter-pair", adapter_pair)
    assert [n for n, _ in real.REAL_SECTIONS][-1] == "adapter-pair"
    ctx = real.real_section(ref="zoo:base", only=("adapter-pair",))
    assert seen == ["zoo:base"] and ctx.results == {"adapter_pair": {"rows": 0}} and not ctx.ok


def test_unknown_section_is_a_one_line_error():
    from kvbridge.cli.main import cli

    res = CliRunner().invoke(cli, ["demo", "--sections", "zoo,bogus"])
    assert res.exit_code == 2 and res.stderr.startswith("error: unknown demo section 'bogus'")


def test_each_section_prints_its_time_and_the_bench_reads_it():
    """`kvbridge demo` prints each section's wall and CPU time as it ends and the total with the load
    average; bench/bench_demo.py (the 3-minute check of the default) parses those lines."""
    import importlib.util
    from pathlib import Path

    from kvbridge.cli.main import cli

    res = CliRunner().invoke(cli, ["demo", "--sections", "identity", "--families", "llama", "--new-tokens", "2"])
    assert res.exit_code == 0, res.output
    path = Path(__file__).resolve().parents[2] / "bench" / "bench_demo.py"
    spec = importlib.util.spec_from_file_location("bench_demo", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    found = [m.groups() for m in map(bench.SECTION.match, res.stdout.splitlines()) if m]
    assert [name for name, _, _ in found] == ["identity"] and float(found[0][1]) > 0
    summary = [line for line in res.stdout.splitlines() if line.startswith("demo: ")]
    assert len(summary) == 1 and "identity " in summary[0] and "load average" in summary[0]
