"""kvbridge.cli.output: the one output guard on stdout/stderr."""

from __future__ import annotations

import io
import sys

import click

from kvbridge.cli.output import SafeStream, clean, guarded_output


def test_off_a_terminal_every_escape_is_shown():
    assert clean("a\x1b[1mb\x1b]0;t\x07\n\r", tty=False) == "a\\u001b[1mb\\u001b]0;t\\u0007\n\r"


def test_on_a_terminal_only_the_programs_own_styling_passes():
    styled = click.style("ok", bold=True, fg="green")
    assert clean(styled, tty=True) == styled
    assert clean("\r\x1b[Kline", tty=True) == "\r\x1b[Kline"
    assert clean("\x1b]0;title\x07 \x1b[2J", tty=True) == "\\u001b]0;title\\u0007 \\u001b[2J"


def test_click_echo_through_the_guard():
    inner = io.StringIO()
    saved = sys.stdout
    sys.stdout = inner
    try:
        with guarded_output():
            click.echo("title\x1b]0;x\x07")
            with guarded_output():  # idempotent
                assert isinstance(sys.stdout, SafeStream) and not isinstance(sys.stdout.inner, SafeStream)
    finally:
        sys.stdout = saved
    assert inner.getvalue() == "title\\u001b]0;x\\u0007\n"
