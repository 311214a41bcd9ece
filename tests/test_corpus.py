"""The corpus reader: one hash per corpus, folders of .py/.txt, the stable split by file."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from kvbridge.corpus import CorpusError, Split, read_corpus, split_overlap


def _folder(root, n=40):
    root.mkdir()
    (root / "pkg").mkdir()
    for i in range(n):
        sub = root / "pkg" if i % 2 else root
        (sub / f"mod{i}.py").write_text(f"def f{i}():\n    return {i}\n", encoding="utf-8")
    (root / "notes.txt").write_text("plain text\n", encoding="utf-8")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "junk.py").write_text("never read\n")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "x.py").write_text("never read\n")
    (root / "data.bin").write_bytes(b"\x00\x01")
    return root


def test_a_file_corpus_hash_is_sha256sum(tmp_path):
    f = tmp_path / "c.txt"
    f.write_bytes("héllo\nworld\n".encode())
    c = read_corpus(f)
    assert c.kind == "file" and c.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    assert c.texts == ("héllo\nworld\n",)


def test_a_folder_hash_is_the_documented_digest_and_moves_with_content_not_location(tmp_path):
    root = _folder(tmp_path / "a")
    c = read_corpus(root)
    rels = sorted(
        p.relative_to(root).as_posix()
        for p in list(root.rglob("*.py")) + [root / "notes.txt"]
        if "__pycache__" not in p.parts and ".hidden" not in p.parts
    )
    assert [f.rel for f in c.files] == rels and "pkg/mod1.py" in rels
    h = hashlib.sha256()
    for rel in rels:
        h.update(rel.encode() + b"\0" + hashlib.sha256((root / rel).read_bytes()).digest())
    assert c.sha256 == h.hexdigest()
    assert read_corpus(shutil.copytree(root, tmp_path / "elsewhere")).sha256 == c.sha256
    (root / "mod0.py").rename(root / "mod0_renamed.py")
    assert read_corpus(root).sha256 != c.sha256


def test_non_utf8_files_in_a_folder_are_skipped_and_listed_but_a_single_file_is_refused(tmp_path):
    root = _folder(tmp_path / "a", n=4)
    (root / "latin.py").write_bytes("# caf\xe9\n".encode("latin-1"))
    c = read_corpus(root)
    assert c.skipped == ("latin.py",) and "latin.py" in c.record()["skipped_not_utf8"]
    with pytest.raises(CorpusError, match="not UTF-8"):
        read_corpus(root / "latin.py")


def test_the_split_is_stable_monotone_and_partitions_the_folder(tmp_path):
    c = read_corpus(_folder(tmp_path / "a", n=400))
    s10, s30 = Split(0.1), Split(0.3)
    held10 = {f.rel for f in c.part(s10, "heldout")}
    cal10 = {f.rel for f in c.part(s10, "calibration")}
    assert held10 and cal10 and not held10 & cal10 and held10 | cal10 == {f.rel for f in c.files}
    assert 0.04 < len(held10) / len(c.files) < 0.2  # a hash, not a count: roughly the share
    assert held10 <= {f.rel for f in c.part(s30, "heldout")}  # a larger share only adds files
    assert held10 == {f.rel for f in read_corpus(tmp_path / "a").part(Split(0.1), "heldout")}
    assert {f.rel for f in c.part(Split(0.1, salt="other"), "heldout")} != held10
    order = [f.rel for f in c.part(s10, "calibration")]
    assert order != sorted(order)  # read in the key's order: a capped fit spans many files
    assert not split_overlap(c, s30, s10) and set(split_overlap(c, s10, s30)) == (
        {f.rel for f in c.part(s30, "heldout")} - held10
    )
    assert Split.from_record(s10.record()) == s10


def test_bad_corpora_and_bad_splits_are_one_line_errors(tmp_path):
    with pytest.raises(CorpusError, match="no such corpus"):
        read_corpus(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="has no .py or .txt files"):
        read_corpus(tmp_path / "empty")
    for bad in (1.0, -0.1, float("nan"), True):
        with pytest.raises(CorpusError, match="held-out share"):
            Split(bad)
    with pytest.raises(CorpusError, match="split rule"):
        Split(0.1, rule="by-moon-phase")
    one = tmp_path / "one"
    one.mkdir()
    (one / "a.py").write_text("x = 1\n")
    c = read_corpus(one)
    which = "calibration" if Split(0.5).is_heldout("a.py") else "heldout"
    with pytest.raises(CorpusError, match=f"the {which} part of the folder is empty"):
        c.part_texts(Split(0.5), which)
