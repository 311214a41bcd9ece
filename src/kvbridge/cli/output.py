"""The CLI's one output guard: everything a command writes to stdout or stderr passes through
:class:`SafeStream`, so no control character from a file or a plugin reaches the terminal.

On a terminal the program's own styling (SGR colour/bold ``ESC [ ... m``, erase-line ``ESC [ K``)
and the progress line's ``\\r`` pass; every other control character (ESC starting any other
sequence, BEL, C0/C1 controls, DEL, bidi overrides) is written as a visible escape
(:func:`kvbridge.safe_text.escape`). Off a terminal (a pipe, a log file, tests) click has already
stripped its own styles, so every ESC that arrives came from data and is escaped. Newlines and tabs
pass: the program lays out multi-line text; strings from files are escaped whole (newline included)
where they are formatted (:func:`kvbridge.cli.options.fmt_value`, the one-line error rendering).
"""

from __future__ import annotations

import io
import re
import sys
from contextlib import contextmanager

from kvbridge.safe_text import escape

#: the program's own terminal sequences (click.style, the progress line)
_OWN_SEQUENCES = re.compile(r"(\x1b\[[0-9;]*m|\x1b\[K)")
_KEEP = "\n\t\r"


def clean(text: str, tty: bool) -> str:
    """``text`` with every control character but newline, tab, CR (and on a terminal, styling) escaped."""
    if not tty:
        return escape(text, keep=_KEEP)
    parts = _OWN_SEQUENCES.split(text)  # text between the program's own sequences: escaped
    return "".join(p if i % 2 else escape(p, keep=_KEEP) for i, p in enumerate(parts))


class SafeStream(io.TextIOBase):
    """A text stream that writes :func:`clean` text to ``inner`` (str only: bytes are refused, so
    click treats it as the text stream it is)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def write(self, text):  # noqa: D401 - io API
        if not isinstance(text, str):
            raise TypeError("SafeStream takes str")
        self.inner.write(clean(text, self.isatty()))
        return len(text)

    def flush(self):
        try:
            self.inner.flush()
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        try:
            return bool(self.inner.isatty())
        except (AttributeError, ValueError):
            return False

    def fileno(self):
        return self.inner.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self):
        return getattr(self.inner, "encoding", None) or "utf-8"

    @property
    def errors(self):
        return getattr(self.inner, "errors", None) or "strict"


@contextmanager
def guarded_output():
    """``sys.stdout`` and ``sys.stderr`` wrapped in :class:`SafeStream` for the block (idempotent)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if s is None or isinstance(s, SafeStream) else SafeStream(s) for s in saved)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, SafeStream):
                stream.flush()
        sys.stdout, sys.stderr = saved
