"""Exact-token splits on the real tokenizers in ../shared/fixtures/tokenizers (GPT-2 and Qwen2.5
byte-level BPE, Llama-2 SentencePiece, Mistral tokenizer.json), including the cases where the
naive split differs from the joint encoding."""

from __future__ import annotations

import json
import random

import pytest

from kvbridge.models.tokenizer_load import TokenizerError, load_tokenizer
from kvbridge.prefix.splits import SplitError, encode, exact_split, split_text

GUIDE = "You are a careful assistant. Answer in a numbered list, one item per line."
LIVE = "List three fruits."
ZORP = "Define zorp: a zorp is a small blue fruit that tastes like lemon."


@pytest.fixture(scope="module")
def toks(shared_dir):
    base = shared_dir / "fixtures" / "tokenizers"
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_tokenizer(base / name)
        return cache[name]

    return get


@pytest.mark.parametrize("name", ["gpt2", "qwen2.5"])
def test_byte_level_bpe_naive_split_differs_and_safe_split_is_guide_then_space_live(toks, name):
    tok = toks(name)
    for guide, live in ((GUIDE, LIVE), (ZORP, "What colour is a zorp?")):
        r = split_text(tok, guide, live, " ")
        joint = encode(tok, guide + " " + live, add_special_tokens=True)
        assert list(r.joint) == joint
        # the trailing space becomes its own token when guide + " " is encoded alone
        assert not r.naive.matches_joint and len(r.naive.ids) == len(joint) + 1
        assert r.naive.first_difference == len(r.naive.ghost) - 1
        # the notes' exact split: ghost = tokenizer(guide), live = tokenizer(" " + live)
        assert r.safe is not None and r.safe.matches_joint and r.safe.ids == r.joint
        assert list(r.safe.ghost) == encode(tok, guide, add_special_tokens=True)
        assert list(r.safe.live) == encode(tok, " " + live, add_special_tokens=False)
        assert r.safe.ghost_text == guide and r.safe.live_text == " " + live


@pytest.mark.parametrize("name", ["llama2-sentencepiece", "mistral", "mistral/tokenizer.json"])
def test_sentencepiece_ghost_gets_bos_live_does_not(toks, name):
    tok = toks(name)
    r = split_text(tok, GUIDE, LIVE, " ")
    bos = tok.bos_token_id
    assert r.joint[0] == bos and r.special_prefix == (bos,)
    assert not r.naive.matches_joint  # "guide " ends in a lone "▁"
    s = r.require_safe()
    assert s.ghost[0] == bos and bos not in s.live
    assert s.ids == r.joint


def test_sentencepiece_model_loads_without_sentencepiece_and_matches_tokenizer_json(toks, shared_dir):
    from_model = load_tokenizer(shared_dir / "fixtures/tokenizers/mistral/tokenizer.model")
    from_json = toks("mistral/tokenizer.json")
    text = (shared_dir / "corpora" / "tinyshakespeare.txt").read_text()[:20000]
    samples = text.split("\n")[:400] + ["  two spaces", "a  b", "héllo wörld 日本語", "tab\there", "<s> x </s>"]
    for s in samples:
        assert encode(from_model, s, add_special_tokens=True) == encode(from_json, s, add_special_tokens=True), s


def test_llama2_sentencepiece_encodes_like_llama(toks):
    tok = toks("llama2-sentencepiece")
    assert len(tok) == 32000
    assert tok.convert_ids_to_tokens(encode(tok, "Hello world", add_special_tokens=True)) == ["<s>", "▁Hello", "▁world"]


def test_no_safe_split_is_reported_honestly(toks):
    tok = toks("gpt2")
    r = split_text(tok, "hel", "lo there", sep="")
    assert r.safe is None and not r.naive.matches_joint
    assert "spans characters 0-5" in r.reason and "append point 3" in r.reason
    assert r.to_dict()["safe"] == {"kind": "safe", "ghost": [], "live": [], "matches_joint": False, "found": False}
    with pytest.raises(SplitError, match="no exact-token split"):
        r.require_safe()
    with pytest.raises(SplitError, match="no exact-token split"):
        exact_split(tok, "hel", "lo there", sep="")


def test_sentencepiece_dummy_prefix_can_leave_no_split_or_force_a_backup(toks):
    tok = toks("llama2-sentencepiece")
    # no space anywhere near the append point: the live part would get a dummy "▁" the joint lacks
    assert split_text(tok, "Rules:\n", "1. be brief", sep="").safe is None
    # the safe split has to move guide text into the live part; the report says so
    r = split_text(tok, "Answer in French.", "Bonjour, comment ça va ?", sep="\n\n")
    assert r.safe is not None and r.safe.ids == r.joint
    assert r.safe.boundary < len("Answer in French.") and "inside the guide" in r.safe.note


def test_naive_split_that_already_matches(toks):
    tok = toks("gpt2")
    r = split_text(tok, "Rules:\n", "1. be brief", sep="")
    assert r.naive.matches_joint and r.safe.matches_joint


def test_many_random_cut_points_on_real_text(toks, shared_dir):
    """On Shakespeare cut at random word boundaries, the safe split always reproduces the joint ids."""
    text = (shared_dir / "corpora" / "tinyshakespeare.txt").read_text()[:60000]
    words = text.split(" ")
    rng = random.Random(0)
    for name in ("gpt2", "qwen2.5", "llama2-sentencepiece"):
        tok = toks(name)
        naive_diff = 0
        for _ in range(25):
            i = rng.randrange(10, len(words) - 40)
            guide = " ".join(words[i - 10 : i]).strip() or "x"
            live = " ".join(words[i : i + 12]).strip() or "y"
            r = split_text(tok, guide, live, " ")
            naive_diff += not r.naive.matches_joint
            assert r.safe is not None, (name, guide, live, r.reason)
            assert r.safe.ids == r.joint
            assert r.safe.ghost[: len(r.special_prefix)] == r.special_prefix
        assert naive_diff > 0, name  # the artefact is common, not a corner case


def test_split_accepts_a_tokenizers_library_object(shared_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(shared_dir / "fixtures/tokenizers/mistral/tokenizer.json"))
    r = split_text(tok, GUIDE, LIVE)
    assert r.safe.ids == r.joint and r.joint[0] == 1


def test_report_json_keys(toks):
    d = split_text(toks("qwen2.5"), GUIDE, LIVE).to_dict()
    json.dumps(d)
    assert {"joint", "naive", "safe"} <= set(d)
    for k in ("naive", "safe"):
        assert {"ghost", "live", "matches_joint"} <= set(d[k])
    assert d["naive"]["matches_joint"] is False and d["safe"]["matches_joint"] is True and d["safe"]["found"] is True


def test_empty_texts_are_refused(toks):
    with pytest.raises(SplitError, match="guide is empty"):
        split_text(toks("gpt2"), "  ", LIVE)
    with pytest.raises(SplitError, match="live text is empty"):
        split_text(toks("gpt2"), GUIDE, "")


def test_load_tokenizer_paths(shared_dir, tmp_path):
    base = shared_dir / "fixtures" / "tokenizers"
    assert len(load_tokenizer(base / "gpt2" / "vocab.json")) == 50257  # the file, merges.txt next to it
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(TokenizerError, match="holds no tokenizer"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"\0" * 10)
    with pytest.raises(TokenizerError, match="not a tokenizer file"):
        load_tokenizer(bad)
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json")
    with pytest.raises(TokenizerError, match="not a readable tokenizer.json"):
        load_tokenizer(broken)
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(TokenizerError):
        load_tokenizer(tmp_path / "vocab.json")


def test_one_line_error_messages(tmp_path):
    try:
        load_tokenizer(tmp_path / "missing")
    except TokenizerError as exc:
        assert "\n" not in exc.one_line()


def _zoo_folder(name: str = "base"):
    from kvbridge.zoo import zoo_dir

    folder = zoo_dir() / name
    if not (folder / "tokenizer.json").is_file():
        pytest.skip(f"zoo model {name!r} not built at {folder}")
    return folder


def test_zoo_tokenizer_split():
    """The project's own byte-level BPE (the tiny model zoo's tokenizer)."""
    tok = load_tokenizer(_zoo_folder())
    for guide, live in (
        ("First Citizen: Before we proceed any further, hear me speak.", "All: Speak, speak."),
        ("ROMEO: But, soft! what light through yonder window breaks?", "and the king is here."),
    ):
        r = split_text(tok, guide, live, " ")
        assert not r.naive.matches_joint
        assert r.safe is not None and r.safe.ids == r.joint and r.safe.ghost_text == guide
