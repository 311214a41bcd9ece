"""Corpora as users have them: a text file, a JSONL file, or a folder of ``.py`` / ``.txt`` files.

One corpus, one hash (``fit`` records it in the mapping, ``eval`` in its ``data.sha256``):

- a file: the file's sha256, the value ``sha256sum FILE`` prints;
- a folder: sha256 over every ``.py`` and ``.txt`` file under it (``__pycache__`` and hidden
  folders skipped), in the order of their relative POSIX paths, of
  ``relative_path (UTF-8) + b"\\0" + sha256(file bytes)`` (32 raw bytes) per file. Renaming,
  adding, removing or editing a file changes it; where the folder lies does not.

A text or JSONL file is split **by position** (:class:`Tail`, recorded in the mapping): ``eval``
samples from its last ``heldout`` of the characters (from a line start, :func:`heldout_start`),
so ``fit`` reads only the text before that point, and the two commands work on one file with no
flag (``fit --corpus-heldout``, ``eval --heldout-fraction``; 10% by default).

A folder is split into a calibration part and a held-out part **by file**, with a stable rule
(:class:`Split`, recorded in the mapping): a file is held out when
``int(sha256(salt + "\\0" + relative_path)[:8 bytes]) / 2**64 < heldout``. The rule depends on
the path alone (not on the contents, the machine or the other files), so the same folder splits
the same way everywhere, and a file held out at share ``s`` is held out at every share above
``s``. ``fit`` reads only calibration files and ``eval`` only held-out ones; each part is read
in the order of that key (a fixed pseudo-random order), so a fit capped at ``--tokens N`` reads
the start of many modules rather than the alphabetically first few.

In a folder a file that is not UTF-8 text is skipped (listed in :attr:`Corpus.skipped`; it
still counts in the hash); a single file that is not UTF-8 is refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from kvbridge.errors import KVBridgeError

#: file kinds read from a corpus folder
FOLDER_SUFFIXES = (".py", ".txt")
#: the split rule's name, as recorded in mappings
SPLIT_RULE = "path-sha256"
#: the default share of a folder's files held out for evaluation
DEFAULT_HELDOUT = 0.1
DEFAULT_SALT = "kvbridge"


class CorpusError(KVBridgeError):
    """The corpus cannot be read or split as asked."""


@dataclass(frozen=True)
class Split:
    """Which files of a folder are held out: the rule, the share and the salt (all recorded)."""

    heldout: float = DEFAULT_HELDOUT
    salt: str = DEFAULT_SALT
    rule: str = SPLIT_RULE

    def __post_init__(self):
        if self.rule != SPLIT_RULE:
            raise CorpusError(f"unknown corpus split rule {self.rule!r}", f"this kvbridge knows {SPLIT_RULE!r}")
        h = self.heldout
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h < 1 or h != h:
            raise CorpusError(f"corpus held-out share must be in [0, 1), got {h!r}", "use e.g. 0.1")

    def key(self, rel: str) -> float:
        """The file's place in [0, 1): held out below ``heldout``; also the reading order."""
        digest = hashlib.sha256(f"{self.salt}\0{rel}".encode("utf-8")).digest()
        return int.from_bytes(digest[:8], "big") / 2.0**64

    def is_heldout(self, rel: str) -> bool:
        return self.key(rel) < self.heldout

    def record(self) -> dict:
        return {
            "rule": self.rule,
            "heldout": float(self.heldout),
            "salt": self.salt,
            "definition": "held out when int(sha256(salt + '\\0' + relative POSIX path)[:8], big-endian) / 2**64 "
            "< heldout; each part read in that key's order",
        }

    @classmethod
    def from_record(cls, rec: dict) -> "Split":
        try:
            return cls(
                heldout=float(rec["heldout"]),
                salt=str(rec.get("salt", DEFAULT_SALT)),
                rule=str(rec.get("rule", SPLIT_RULE)),
            )
        except (KeyError, TypeError, ValueError):
            raise CorpusError(
                f"the mapping's corpus split record is unreadable: {rec!r}", "fit the mapping again with this kvbridge"
            ) from None


def heldout_start(texts, fraction: float) -> int:
    """Character offset (in the newline-joined corpus text) where the held-out tail of a file starts:
    the first line start at or after ``(1 - fraction)`` of its characters."""
    text = texts if isinstance(texts, str) else "\n".join(texts)
    cut = int(len(text) * (1 - fraction))
    nl = text.find("\n", cut)
    return nl + 1 if cut > 0 and nl >= 0 else cut


def line_cut(text: str, frac: float) -> int:
    """The character index at ``frac`` of ``text``, moved forward to the next line start."""
    if frac <= 0.0:
        return 0
    if frac >= 1.0:
        return len(text)
    i = text.find("\n", int(frac * len(text)))
    return len(text) if i < 0 else i + 1


def slice_text(text: str, lo: float, hi: float) -> str:
    """``text`` between two character fractions, both cuts moved forward to the next line start."""
    return text[line_cut(text, lo) : line_cut(text, hi)]


@dataclass(frozen=True)
class Tail:
    """A file corpus's held-out tail (the last ``heldout`` of its characters, from a line start):
    ``fit`` calibrates on :meth:`front`, ``eval`` samples from the tail; recorded in the mapping."""

    heldout: float = DEFAULT_HELDOUT

    def __post_init__(self):
        Split(heldout=self.heldout)  # a folder split's check of the share: the same one-line error

    def start(self, texts) -> int:
        return heldout_start(texts, self.heldout) if self.heldout > 0 else sum(map(len, texts)) + len(texts) - 1

    def front(self, texts: list[str]) -> list[str]:
        """The documents (the last one cut) before the tail: a prefix of their newline-joined text."""
        end, out, base = self.start(texts), [], 0
        for text in texts:
            if base >= end:
                break
            piece = text[: end - base]
            if piece.strip():
                out.append(piece)
            base += len(text) + 1
        return out

    def record(self, texts) -> dict:
        return {
            "rule": "tail",
            "heldout": float(self.heldout),
            "chars": [self.start(texts), sum(len(t) for t in texts) + max(0, len(texts) - 1)],
            "definition": "eval's held-out tail: from the first line start at or after (1 - heldout) of the "
            "characters of the corpus texts joined with newlines; fit reads only the text before it",
        }


@dataclass(frozen=True)
class CorpusFile:
    rel: str  # relative POSIX path (a file corpus: its name)
    sha256: str
    bytes: int
    text: str | None = field(default=None, repr=False)  # None: not UTF-8 (skipped)


@dataclass(frozen=True)
class Corpus:
    path: str
    kind: str  # "file" or "folder"
    files: tuple[CorpusFile, ...]
    sha256: str
    texts: tuple[str, ...] = field(repr=False, default=())  # file corpus: its documents

    @property
    def skipped(self) -> tuple[str, ...]:
        return tuple(f.rel for f in self.files if f.text is None)

    @property
    def sha256_of(self) -> str:
        return (
            "folder: sha256 over (relative path, file sha256) pairs in path order (kvbridge.corpus)"
            if self.kind == "folder"
            else "the file (sha256sum)"
        )

    def part(self, split: Split, which: str) -> list["CorpusFile"]:
        """The files of one part (``"calibration"`` or ``"heldout"``), in the split key's order."""
        if self.kind != "folder":
            raise CorpusError(f"{self.path}: only a folder corpus is split by file", "pass a folder of .py/.txt files")
        files = [f for f in self.files if f.text is not None and split.is_heldout(f.rel) == (which == "heldout")]
        return sorted(files, key=lambda f: (split.key(f.rel), f.rel))

    def part_texts(self, split: Split, which: str) -> list[str]:
        texts = [f.text for f in self.part(split, which) if f.text and f.text.strip()]
        if not texts:
            raise CorpusError(
                f"{self.path}: the {which} part of the folder is empty (split {split.heldout:g} held out "
                f"of {len(self.files)} files)",
                "use a bigger folder or another held-out share",
            )
        return texts

    def record(self, split: Split | None = None) -> dict:
        """What ``fit`` writes into the mapping (``calibration.corpus``)."""
        rec = {
            **{k: getattr(self, k) for k in ("path", "kind", "sha256", "sha256_of")},
            "files_count": len(self.files),
            "bytes": sum(f.bytes for f in self.files),
        }
        if self.kind == "folder":
            rec["skipped_not_utf8"] = list(self.skipped)
            if split is not None:
                rec["split"] = {
                    **split.record(),
                    "calibration_files": len(self.part(split, "calibration")),
                    "heldout_files": len(self.part(split, "heldout")),
                }
        else:
            rec["files"] = [{"name": f.rel, "sha256": f.sha256, "bytes": f.bytes} for f in self.files]
            if isinstance(split, Tail):
                rec["heldout_tail"] = split.record(list(self.texts))
        return rec


def folder_files(path: Path) -> list[Path]:
    """The corpus files of a folder (``FOLDER_SUFFIXES``; ``__pycache__`` and hidden folders skipped), in
    the order of their relative POSIX paths."""
    hidden = lambda p: any(part == "__pycache__" or part.startswith(".") for part in p.relative_to(path).parts)  # noqa: E731
    out = [p for p in path.rglob("*") if p.suffix in FOLDER_SUFFIXES and p.is_file() and not hidden(p)]
    return sorted(out, key=lambda p: p.relative_to(path).as_posix())


def _documents(f: Path, text: str) -> list[str]:
    if f.suffix not in (".jsonl", ".ndjson"):
        return [text]
    docs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{f}:{n}: not valid JSON ({exc.msg})", "one JSON object per line") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
            raise CorpusError(
                f"{f}:{n}: record has no string field 'text'", 'write one {"text": "..."} object per line'
            )
        docs.append(rec["text"])
    return docs


def read_corpus(path: Path | str) -> Corpus:
    """Read a corpus (see the module docstring); refuses a missing path, an empty corpus, a bad file."""
    p = Path(path)
    if p.is_dir():
        paths = folder_files(p)
        if not paths:
            raise CorpusError(
                f"{p}: folder has no {' or '.join(FOLDER_SUFFIXES)} files",
                "pass a text file, a JSONL file or a folder of .py/.txt files",
            )
        h = hashlib.sha256()
        files = []
        for f in paths:
            raw = f.read_bytes()
            digest = hashlib.sha256(raw)
            rel = f.relative_to(p).as_posix()
            h.update(rel.encode("utf-8") + b"\0" + digest.digest())
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            files.append(CorpusFile(rel, digest.hexdigest(), len(raw), text))
        if not any(f.text and f.text.strip() for f in files):
            raise CorpusError(f"{p}: corpus is empty", "pass a corpus with some text")
        return Corpus(str(path), "folder", tuple(files), h.hexdigest())
    if p.is_file():
        raw = p.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(f"{p}: not UTF-8 text (byte {exc.start})", "convert the corpus to UTF-8") from None
        docs = tuple(t for t in _documents(p, text) if t.strip())
        if not docs:
            raise CorpusError(f"{p}: corpus is empty", "pass a corpus with some text")
        sha = hashlib.sha256(raw).hexdigest()
        return Corpus(str(path), "file", (CorpusFile(p.name, sha, len(raw), text),), sha, docs)
    raise CorpusError(f"{p}: no such corpus file or folder", "check --corpus")


def calibration_texts(path, heldout: float):
    """``(texts, sha256, split)`` that ``fit`` calibrates on: a folder's calibration files (``split`` a
    :class:`Split`), or a file's text before its held-out tail (a :class:`Tail`)."""
    corpus = read_corpus(path)
    if corpus.kind == "file":
        tail = Tail(heldout=heldout)
        front = tail.front(list(corpus.texts))
        if not front:
            raise CorpusError(
                f"{path}: nothing is left to calibrate on before the held-out last {heldout:g} of the file",
                "use a bigger corpus or a smaller --corpus-heldout",
            )
        return front, corpus.sha256, tail
    split = Split(heldout=heldout)
    return corpus.part_texts(split, "calibration"), corpus.sha256, split


def corpus_record(path: Path | str, split=None) -> dict:
    """What a corpus is, verifiably (:meth:`Corpus.record`)."""
    return read_corpus(path).record(split)


def load_corpus(path: Path | str) -> tuple[list[str], str]:
    """``(texts, sha256)`` of a corpus; a folder gives all its UTF-8 files in relative-path order (no
    split; ``fit``/``eval`` split folders with :class:`Split`)."""
    corpus = read_corpus(path)
    if corpus.kind == "file":
        return list(corpus.texts), corpus.sha256
    return [f.text for f in corpus.files if f.text and f.text.strip()], corpus.sha256


def calibration_span(texts: list[str], tokenizer, used_tokens: int) -> dict:
    """Which part of the corpus text the first ``used_tokens`` calibration tokens came from.

    The corpus texts joined with ``"\n"`` (for a single text file: the file itself) are
    consumed from the start (:func:`tokenize_corpus`); the span is ``[0, end)`` in characters
    and in UTF-8 bytes of that joined text, plus the token count. ``kvbridge eval`` refuses
    samples from inside it (they would measure text the mapping was fitted on).
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    got, end, total_chars = 0, 0, sum(len(t) for t in texts) + max(0, len(texts) - 1)
    base = 0
    for text in texts:
        if got >= used_tokens:
            break
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"]) + (eos is not None)
        end = base + len(text)
        if got + n <= used_tokens:
            got += n
            base += len(text) + 1
            continue
        take = used_tokens - got  # a partly used document: map its last used token to characters
        try:
            offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            if 0 < take <= len(offsets):
                end = base + int(offsets[take - 1][1])
        except (NotImplementedError, KeyError, TypeError, ValueError):
            pass  # no offsets (slow tokenizer): count the whole document as used (conservative)
        got = used_tokens
        break
    return {
        "tokens": int(min(got, used_tokens)),
        "chars": [0, int(end)],
        "bytes": [0, len("\n".join(texts)[:end].encode("utf-8"))],
        "of_chars": int(total_chars),
        "text": "corpus texts joined with newlines (a single text file: the file itself)",
    }


def split_overlap(corpus: Corpus, fitted: Split, evaluated: Split) -> list[str]:
    """Files ``evaluated`` holds out that the mapping (split by ``fitted``) could have calibrated on."""
    return [
        f.rel
        for f in corpus.files
        if f.text is not None and evaluated.is_heldout(f.rel) and not fitted.is_heldout(f.rel)
    ]
