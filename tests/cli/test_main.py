"""The CLI root: fast start-up, one-line errors, CLI.md in sync."""

from __future__ import annotations

import subprocess
import sys

from kvbridge.cli import docs


def _run(*code: str):
    return subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True)


def test_help_and_plugins_do_not_import_torch():
    res = _run(
        "import sys",
        "from kvbridge.cli.main import build_cli",
        "for args in (['--help'], ['plugins'], ['plugins', '--json']):",
        "    try:",
        "        build_cli().main(args=args, standalone_mode=False)",
        "    except SystemExit:",
        "        pass",
        "print('HEAVY', [m for m in ('torch', 'transformers') if m in sys.modules])",
    )
    assert res.returncode == 0, res.stderr
    assert "HEAVY []" in res.stdout


def test_user_errors_are_one_line_with_exit_2():
    res = subprocess.run([sys.executable, "-m", "kvbridge", "plugins", "--bogus"], capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr


def test_kvbridge_error_is_printed_as_one_line(monkeypatch):
    import click
    from click.testing import CliRunner

    from kvbridge.cli.main import cli
    from kvbridge.errors import ConfigError

    @click.command("raise-it")
    def raise_it():
        raise ConfigError("config.json is missing 'num_attention_heads'", "add it")

    cli.add_command(raise_it)
    try:
        result = CliRunner().invoke(cli, ["raise-it"])
    finally:
        cli.commands.pop("raise-it")
    assert result.exit_code == 2
    assert result.output.strip() == "error: config.json is missing 'num_attention_heads' (fix: add it)"


def test_cli_md_is_in_sync(repo_root):
    want = docs.render()
    got = (repo_root / "CLI.md").read_text()
    assert got == want, "CLI.md is stale: run `make cli-docs`"
