"""The opt-in pair section: the protocol on zoo models standing in for the Qwen pair, and the
one-line error when the pair is not fetched."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kvbridge.demo import pair


def test_the_pair_section_runs_check_identity_fit_eval(tmp_path, capsys):
    ok = pair.pair_section(
        source="zoo:base",
        target="zoo:wide",
        tokens=1024,
        samples=4,
        prefix_len=32,
        continuation_len=4,
        report_dir=str(tmp_path),
    )
    out = capsys.readouterr().out
    assert ok
    assert "check (configs only): mappable" in out
    assert out.count(": bitwise (") == 2  # identity on each model
    assert "source model alone" in out and "transferred" in out
    assert (tmp_path / "pair-mapping" / "manifest.json").is_file()


def test_the_corpus_holds_only_standard_library_python(tmp_path):
    folder = pair.stdlib_corpus(tmp_path / "c", packages=("json",))
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))
    assert "json/__init__.py" in files and all(f.endswith(".py") or "." not in f.rsplit("/", 1)[-1] for f in files)


def test_a_missing_pair_is_a_one_line_error_that_says_how_to_fetch(monkeypatch, tmp_path):
    from kvbridge.cli.main import cli
    from kvbridge.errors import KVBridgeError

    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(KVBridgeError) as info:
        pair.require_fetched()
    assert "kvbridge models fetch pair" in info.value.one_line()
    res = CliRunner().invoke(cli, ["demo", "--sections", "pair"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "kvbridge models fetch pair" in res.stderr
