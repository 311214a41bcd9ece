"""Text from files and plugins made safe to print: control characters escaped.

A string read from a manifest, a config, tokenizer metadata or a plugin (names, error messages
quoting them) may carry terminal escape sequences (``ESC ] 0 ; title BEL`` changes the window title,
``ESC [ 2 J`` clears the screen, ``ESC ] 8`` forges links) or bidirectional overrides that reorder
what is shown. :func:`escape` writes every such character as a visible escape, ``\\uXXXX``
(``\\u001b``, ``\\u0007``, ``\\u202e``: the JSON spelling, so escaped JSON output stays valid JSON
with the same values): C0 controls, DEL, C1 controls, the Unicode line/paragraph
separators and the bidi embedding/override/isolate marks. Newline and tab are escaped too unless
the caller keeps them (:func:`escape_block`, for multi-line text the program itself lays out).

The CLI's output streams pass everything through :func:`kvbridge.cli.output.clean`
(:mod:`kvbridge.cli.output`), and the one-line error rendering (:mod:`kvbridge.errors`) and the
table formatters (:mod:`kvbridge.cli.options`) use :func:`escape`.
"""

from __future__ import annotations

import re

#: bidi embedding/override/isolate marks and the Unicode line/paragraph separators
_FORMAT_MARKS = "\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f" + _FORMAT_MARKS + "]")


def escape(text: object, keep: str = "") -> str:
    """``str(text)`` with every control character (except those in ``keep``) written as an escape."""
    text = str(text)
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else f"\\u{ord(m.group()):04x}", text)


def escape_block(text: object) -> str:
    """:func:`escape`, keeping newlines and tabs (multi-line text laid out by the program)."""
    return escape(text, keep="\n\t")


def has_unsafe(text: str, keep: str = "") -> bool:
    """Whether ``text`` holds a character :func:`escape` would rewrite."""
    return any(m.group() not in keep for m in _UNSAFE.finditer(text))
