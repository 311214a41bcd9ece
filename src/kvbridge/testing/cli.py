"""Running ``kvbridge`` commands in tests (built-in and plugin commands alike) and checking the one-line
error contract: exit 2, ``error: <what> (fix: <how>)`` on one stderr line, no traceback."""

from __future__ import annotations


def run_cli(*args, **invoke):
    """``kvbridge ARGS...`` in-process (click's ``CliRunner``); arguments are turned into strings."""
    from click.testing import CliRunner

    from kvbridge.cli.main import build_cli

    return CliRunner().invoke(build_cli(), [str(a) for a in args], **invoke)


def one_line_error(result, *needles: str) -> str:
    """Assert ``result`` is kvbridge's one-line error containing every needle; return the line."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in result.output, result.output
    for n in needles:
        assert n in err, err
    return err
