"""Contrastive pairs: reading (one-line errors naming the line), rendering, the positions read."""

from __future__ import annotations

import json

import pytest

from kvbridge.steer.pairs import PairsError, encode_side, read_pairs


def write(tmp_path, *lines):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(line + "\n" for line in lines))
    return p


def test_reads_texts_and_chat_turns_skipping_blanks_and_comments(tmp_path):
    turns = [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Name a fruit."}]
    p = write(
        tmp_path,
        "# a comment",
        json.dumps({"positive": "a b", "negative": "c d"}),
        "",
        json.dumps({"positive": turns, "negative": turns[1:]}),
    )
    pairs = read_pairs(p)
    assert [x.line for x in pairs] == [2, 4]
    assert pairs[0].positive == "a b" and pairs[1].positive == (
        ("system", "Answer in JSON."),
        ("user", "Name a fruit."),
    )


@pytest.mark.parametrize(
    "line,needle",
    [
        ('{"positive": "a"', "not JSON"),
        ('{"positive": "a"}', "'positive' and 'negative'"),
        ('["a", "b"]', "'positive' and 'negative'"),
        ('{"positive": "  ", "negative": "b"}', "empty text"),
        ('{"positive": 3, "negative": "b"}', "non-empty text or a non-empty list"),
        ('{"positive": [{"role": "user"}], "negative": "b"}', "turn 0"),
        ('{"positive": [], "negative": "b"}', "non-empty"),
    ],
)
def test_malformed_lines_are_one_line_errors_naming_the_line(tmp_path, line, needle):
    p = write(tmp_path, json.dumps({"positive": "ok", "negative": "ok"}), line)
    with pytest.raises(PairsError) as err:
        read_pairs(p)
    assert f"{p}:2" in str(err.value) and needle in str(err.value) and "\n" not in str(err.value)


def test_empty_and_missing_files_are_refused(tmp_path):
    with pytest.raises(PairsError, match="has no pairs"):
        read_pairs(write(tmp_path, "", "# only a comment"))
    with pytest.raises(PairsError, match="cannot read"):
        read_pairs(tmp_path / "absent.jsonl")
    (tmp_path / "bad.jsonl").write_bytes(b'{"positive": "\xff", "negative": "x"}\n')
    with pytest.raises(Exception, match="UTF-8"):
        read_pairs(tmp_path / "bad.jsonl")


def test_positions_last_final_and_span(zoo_base):
    _, tok = zoo_base
    ids = tok("ROMEO: my sweet love")["input_ids"]
    last = encode_side(tok, "ROMEO: my sweet love", "last")
    final = encode_side(tok, "ROMEO: my sweet love", "final")
    assert list(last.ids) == ids and (last.start, last.stop) == (len(ids) - 2, len(ids) - 1)
    assert (final.start, final.stop) == (len(ids) - 1, len(ids))
    span = encode_side(tok, "ROMEO: my[[ sweet love]], fair", "span")
    whole = tok("ROMEO: my sweet love, fair")["input_ids"]
    head = tok("ROMEO: my")["input_ids"]
    upto = tok("ROMEO: my sweet love")["input_ids"]
    assert list(span.ids) == whole and (span.start, span.stop) == (len(head), len(upto))
    assert whole[: len(upto)] == upto  # the span's end is an exact-token boundary here


def test_a_span_boundary_inside_a_token_is_refused(zoo_base):
    _, tok = zoo_base
    with pytest.raises(PairsError, match="inside a token"):
        encode_side(tok, "ROMEO: my s[[weet]] love", "span")
    with pytest.raises(PairsError, match="no single"):
        encode_side(tok, "ROMEO: no span here", "span")


def test_chat_turns_use_the_template_with_the_generation_prompt():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, turns, add_generation_prompt, tokenize):
            assert add_generation_prompt and not tokenize
            return "".join(f"<{t['role']}>{t['content']}" for t in turns) + "<assistant>"

    from kvbridge.steer.pairs import render

    assert render(Tok(), (("user", "hi"),)) == "<user>hi<assistant>"

    class Plain:
        chat_template = None

    assert render(Plain(), (("user", "hi"),)) == "user: hi\n"
