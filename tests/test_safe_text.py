"""kvbridge.safe_text: control characters from files written as visible escapes."""

from __future__ import annotations

import json

from kvbridge.safe_text import escape, escape_block, has_unsafe


def test_escape_every_control_class():
    text = "a\x1b]0;t\x07b\x00\x7f\x85\x9b\u202e\u2066\u2028\nc\td"
    out = escape(text)
    assert out == "a\\u001b]0;t\\u0007b\\u0000\\u007f\\u0085\\u009b\\u202e\\u2066\\u2028\\u000ac\\u0009d"
    assert not has_unsafe(out)


def test_block_keeps_newline_and_tab_only():
    assert escape_block("a\nb\tc\rd\x1be") == "a\nb\tc\\u000dd\\u001be"


def test_plain_text_and_non_ascii_untouched():
    for text in ("plain", "café ▁ 日本語 – ok", ""):
        assert escape(text) is text or escape(text) == text


def test_escaped_json_stays_json_with_the_same_value():
    value = "x\x9b\u202e\x7fy"
    raw = json.dumps({"v": value}, ensure_ascii=False)
    assert json.loads(escape_block(raw)) == {"v": value}
