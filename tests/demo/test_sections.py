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
