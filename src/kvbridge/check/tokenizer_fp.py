"""Tokenizer fingerprints from tokenizer files, in pure Python (no ``tokenizers``, no torch).

A token-aligned KV transfer is only meaningful when both models turn the same text into the
same token ids. This module reads whichever tokenizer files a model folder has and hashes
their *normalised content*, so the same tokenizer gives the same fingerprint whatever files
carry it:

- ``tokenizer.json`` (Hugging Face fast tokenizer: ``model.vocab``, ``model.merges``,
  ``added_tokens``),
- ``vocab.json`` + ``merges.txt`` (byte-level BPE; a ``#version`` header line is ignored),
- ``tokenizer.model`` (SentencePiece protobuf, parsed here with a tiny wire-format reader),
- plus ``tokenizer_config.json`` (``added_tokens_decoder``, special-token roles),
  ``special_tokens_map.json`` and ``added_tokens.json``.

A fingerprint has separate hashes, so a comparison can say *what* differs:

- ``base``: the model vocabulary (token -> id) without added tokens,
- ``vocab``: base vocabulary plus added tokens (the full id space),
- ``rules``: how text becomes tokens beyond the vocabulary: BPE merges (``rules_format``
  ``"merges"``) or SentencePiece scores, model type and normaliser (``"sentencepiece"``);
  rules in different formats cannot be compared,
- ``special``: special-token roles (bos/eos/unk/pad and whether BOS/EOS are added).

Pre-tokeniser and normaliser settings of ``tokenizer.json`` are not hashed (``vocab.json`` +
``merges.txt`` do not carry them), so two BPE tokenizers that differ only there compare equal.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from kvbridge.check.validate import load_json
from kvbridge.errors import ConfigError
from kvbridge.paths import cache_file, cache_read, cache_write

#: files that carry a tokenizer, in the order they are looked for
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)
_CACHE_VERSION = 1
#: special-token roles that are hashed into ``special``
ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")
FLAGS = ("add_bos_token", "add_eos_token")


def _sha(obj: Any) -> str:
    blob = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TokenizerFingerprint:
    """What identifies a tokenizer for token-aligned transfer (all hashes are sha256 hex)."""

    kind: str  # "bpe", "sentencepiece-bpe", "sentencepiece-unigram", "unigram", "wordpiece", ...
    base: str  # model vocabulary token -> id, without added tokens
    vocab: str  # full id space: base vocabulary plus added tokens
    rules: str  # merges (BPE) or SentencePiece scores + normaliser; "" when there are none
    rules_format: str  # "merges", "sentencepiece" or ""
    special: str  # special-token roles and add_bos/add_eos flags
    vocab_size: int  # distinct ids (base + added)
    num_added: int  # added tokens (ids not in the base vocabulary, or re-declared ones)
    special_tokens: tuple = ()  # ((role, content), ...) as read, for messages
    files: tuple = ()  # file names it was computed from

    @property
    def digest(self) -> str:
        """One hash of everything that decides token ids (vocab + rules + special roles)."""
        return _sha([self.vocab, self.rules, self.rules_format, self.special])

    def to_dict(self) -> dict:
        names = ("kind", "base", "vocab", "rules", "rules_format", "special", "vocab_size", "num_added")
        return {
            "digest": self.digest,
            **{name: getattr(self, name) for name in names},
            "special_tokens": dict(self.special_tokens),
            "files": list(self.files),
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "TokenizerFingerprint":
        fp = cls(
            base=str(data["base"]),
            vocab=str(data["vocab"]),
            **{k: str(data.get(k, "")) for k in ("kind", "rules", "rules_format", "special")},
            **{k: int(data.get(k, 0)) for k in ("vocab_size", "num_added")},
            special_tokens=tuple(sorted((str(k), str(v)) for k, v in (data.get("special_tokens") or {}).items())),
            files=tuple(data.get("files") or ()),
        )
        if "digest" in data and data["digest"] != fp.digest:
            raise ConfigError(
                "tokenizer fingerprint 'digest' does not match its parts",
                "recompute it with kvbridge.check.tokenizer_fp.fingerprint_dir",
            )
        return fp

    def short(self) -> str:
        return f"{self.kind} {self.vocab_size} ids sha256:{self.digest[:12]}"


# -- comparison --------------------------------------------------------------------------------
def compare(src: TokenizerFingerprint, tgt: TokenizerFingerprint) -> tuple[str, str]:
    """``(verdict, action)`` for a token-aligned transfer from ``src`` to ``tgt``.

    ``blocking`` when token ids do not line up (different vocabularies or merge rules);
    ``mappable`` when the base vocabulary agrees but added tokens or BOS handling differ (the
    transfer must keep the prefix free of them); ``same`` otherwise.
    """
    if src.vocab != tgt.vocab:
        if src.base == tgt.base:
            return (
                "mappable",
                f"same base vocabulary, different added tokens ({src.num_added} vs {tgt.num_added}):"
                " plain text tokenises identically; keep tokens only one side has out of the prefix",
            )
        return (
            "blocking",
            f"different vocabularies ({src.vocab_size} vs {tgt.vocab_size} ids): token ids do not line"
            " up, so a token-aligned transfer is impossible (re-prefill the target instead)",
        )
    if src.rules_format and src.rules_format == tgt.rules_format and src.rules != tgt.rules:
        return (
            "blocking",
            "same vocabulary but different merge rules: the same text gives different"
            " token ids (re-prefill the target instead)",
        )
    note = ""
    if src.rules_format != tgt.rules_format and src.rules_format and tgt.rules_format:
        note = f" (merge rules not comparable: {src.rules_format} vs {tgt.rules_format} files; vocab identical)"
    s, t = dict(src.special_tokens), dict(tgt.special_tokens)
    diff = sorted(k for k in set(s) & set(t) if s[k] != t[k])  # roles both sides declare
    if diff:
        if {"bos_token", "add_bos_token"} & set(diff):
            return (
                "mappable",
                f"same token ids, BOS handling differs ({', '.join(diff)}): align the"
                f" prefix start (drop or add the BOS token){note}",
            )
        return (
            "same",
            f"same token ids; special-token roles differ ({', '.join(diff)}): reuse the cache token for token{note}",
        )
    return ("same", f"identical tokenizer: token ids line up one to one{note}")


# -- readers -----------------------------------------------------------------------------------
def _load_json(path: Path, object_only: bool = False) -> Any:
    return load_json(path, what=f"{path.name} file", object_only=object_only)


def _token_content(value: Any) -> str | None:
    """A special token as written in tokenizer_config / special_tokens_map (str or AddedToken dict)."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return None if value is None else str(value)


def _merges_from_list(merges: Iterable) -> list[str]:
    return [" ".join(str(x) for x in m) if isinstance(m, (list, tuple)) else str(m) for m in merges]


def _merges_txt(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({type(exc).__name__})", "replace the merges file") from None
    if lines and lines[0].startswith("#version"):
        lines = lines[1:]
    return [ln.rstrip("\r") for ln in lines if ln.rstrip("\r")]


# SentencePiece ModelProto, read with the protobuf wire format (fields we need only)
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes):
    """Yield ``(field_number, wire_type, value)`` of one protobuf message."""
    pos = 0
    n = len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > n:
            raise ValueError("truncated message")
        yield number, wire, value


SP_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


def parse_sentencepiece(path: Path) -> dict:
    """Pieces, scores, types, model type and special ids of a SentencePiece ``tokenizer.model``."""
    try:
        buf = path.read_bytes()
        pieces: list[tuple[str, float, int]] = []
        trainer: dict[int, Any] = {}
        normalizer = b""
        for number, wire, value in _fields(buf):
            if number == 1 and wire == 2:
                piece, score, ptype = "", 0.0, 1
                for n2, w2, v2 in _fields(value):
                    if n2 == 1 and w2 == 2:
                        piece = v2.decode("utf-8")
                    elif n2 == 2 and w2 == 5:
                        score = struct.unpack("<f", v2)[0]
                    elif n2 == 3 and w2 == 0:
                        ptype = v2
                pieces.append((piece, score, ptype))
            elif number == 2 and wire == 2:
                for n2, w2, v2 in _fields(value):
                    if w2 == 0:
                        trainer[n2] = v2
            elif number == 3 and wire == 2:
                normalizer = bytes(value)
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        raise ConfigError(
            f"{path}: not a SentencePiece model ({exc})", "replace tokenizer.model with the model's published file"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})", "check the file's permissions") from None
    if not pieces:
        raise ConfigError(
            f"{path}: not a SentencePiece model (no pieces)", "replace tokenizer.model with the model's published file"
        )

    def _id(field_no: int, default: int) -> int:  # int32 ids: -1 is encoded as a 64-bit varint
        v = trainer.get(field_no, default)
        return v - (1 << 64) if v >= (1 << 63) else v

    return {
        "pieces": pieces,
        "model_type": SP_MODEL_TYPES.get(trainer.get(3, 1), "unigram"),
        "normalizer": normalizer,
        "unk_id": _id(40, 0),
        "bos_id": _id(41, 1),
        "eos_id": _id(42, 2),
        "pad_id": _id(43, -1),
    }


# -- fingerprinting -----------------------------------------------------------------------------
def find_tokenizer_files(folder: Path) -> tuple[Path, ...]:
    """The tokenizer files present in ``folder`` (empty when it has none that define a vocabulary)."""
    folder = Path(folder)
    found = tuple(folder / n for n in TOKENIZER_FILES if (folder / n).is_file())
    return found if {"tokenizer.json", "tokenizer.model", "vocab.json"} & {p.name for p in found} else ()


def cached(key: Callable[[], str], compute: Callable[[], "TokenizerFingerprint"], *, cache: bool = True):
    """``compute()``, kept under ``key()`` in ``$KVBRIDGE_HOME/tokenizer-fingerprints.json`` (the one
    reader and writer of that file, for tokenizer files and GGUF metadata alike)."""
    path = cache_file("tokenizer-fingerprints.json") if cache else None
    k = key() if path is not None else ""
    hit = cache_read(path).get(k)
    if isinstance(hit, dict):
        try:
            return TokenizerFingerprint.from_dict(hit)
        except (KeyError, ValueError, TypeError, ConfigError):
            pass
    fp = compute()
    cache_write(path, k, fp.to_dict(), limit=256)
    return fp


def _raw_key(paths: list[Path]) -> str:
    h = hashlib.sha256(f"v{_CACHE_VERSION}".encode())
    for p in sorted(paths, key=lambda x: x.name):
        h.update(p.name.encode() + b"\0")
        try:
            h.update(hashlib.sha256(p.read_bytes()).digest())
        except OSError:
            h.update(b"unreadable")
    return h.hexdigest()


def fingerprint_files(files: Iterable[Path | str], *, cache: bool = True) -> TokenizerFingerprint:
    """Fingerprint a tokenizer from its files (see the module docstring for what is read).

    Parsing a 2-4 MB vocabulary takes a few hundred ms, so results are cached by the raw
    bytes of the files in ``$KVBRIDGE_HOME`` (default ``~/.cache/kvbridge``); set
    ``KVBRIDGE_NO_CACHE=1`` to turn the cache off.
    """
    paths = [Path(f) for f in files]
    return cached(lambda: _raw_key(paths), lambda: _fingerprint(paths), cache=cache)


def _fingerprint(paths: list[Path]) -> TokenizerFingerprint:
    by_name = {p.name: p for p in paths}
    base: dict[int, str] = {}
    rules: Any = None
    rules_format = ""
    kind = ""
    added: dict[int, str] = {}
    roles: dict[str, Any] = {}
    used: list[str] = []

    if "tokenizer.json" in by_name:
        path = by_name["tokenizer.json"]
        data = _load_json(path)
        model = data.get("model") if isinstance(data, Mapping) else None
        if not isinstance(model, Mapping) or "vocab" not in model:
            raise ConfigError(
                f"{path}: field 'model.vocab' is missing", "replace tokenizer.json with the model's published file"
            )
        kind = str(model.get("type", "")).lower() or "bpe"
        vocab = model["vocab"]
        if isinstance(vocab, Mapping):  # BPE / WordPiece / WordLevel: token -> id
            base = {int(i): str(t) for t, i in vocab.items()}
        elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            base = {i: str(p[0]) for i, p in enumerate(vocab)}
            rules, rules_format = [float(p[1]) for p in vocab], "unigram-scores"
        if "merges" in model:
            rules, rules_format = _merges_from_list(model.get("merges") or []), "merges"
        added |= {int(tok["id"]): str(tok["content"]) for tok in data.get("added_tokens") or []}
        used.append("tokenizer.json")
    elif "vocab.json" in by_name:
        vocab = _load_json(by_name["vocab.json"], object_only=True)  # token -> id
        base = {int(i): str(t) for t, i in vocab.items()}
        kind = "bpe"
        used.append("vocab.json")
        if "merges.txt" in by_name:
            rules, rules_format = _merges_txt(by_name["merges.txt"]), "merges"
            used.append("merges.txt")
    elif "tokenizer.model" in by_name:
        sp = parse_sentencepiece(by_name["tokenizer.model"])
        base = {i: p[0] for i, p in enumerate(sp["pieces"])}
        kind = f"sentencepiece-{sp['model_type']}"
        rules = {
            "model_type": sp["model_type"],
            "scores": [p[1] for p in sp["pieces"]],
            "types": [p[2] for p in sp["pieces"]],
            "normalizer": hashlib.sha256(sp["normalizer"]).hexdigest(),
        }
        rules_format = "sentencepiece"
        for role in ROLES:  # bos_token -> the model's bos_id ...
            idx = sp[role.replace("_token", "_id")]
            if 0 <= idx < len(sp["pieces"]):
                roles[role] = sp["pieces"][idx][0]
        used.append("tokenizer.model")
    else:
        raise ConfigError(
            "no tokenizer file (tokenizer.json, vocab.json or tokenizer.model) found",
            "pass a folder that has the model's tokenizer files",
        )

    if "added_tokens.json" in by_name:
        data = _load_json(by_name["added_tokens.json"])
        if isinstance(data, Mapping):
            added |= {int(idx): str(content) for content, idx in data.items()}
        used.append("added_tokens.json")
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # config wins over the map
        if name not in by_name:
            continue
        data = _load_json(by_name[name], object_only=True)
        used.append(name)
        roles |= {role: _token_content(data[role]) for role in ROLES if role in data}
        roles |= {flag: bool(data[flag]) for flag in FLAGS if flag in data}
        for idx, tok in (data.get("added_tokens_decoder") or {}).items():
            content = _token_content(tok)
            if content is not None:
                added[int(idx)] = content

    full = base | added
    roles_clean = {k: v for k, v in roles.items() if v is not None}
    return TokenizerFingerprint(
        kind=kind,
        base=_sha(sorted(base.items())),
        vocab=_sha(sorted(full.items())),
        rules=_sha(rules) if rules is not None else "",
        rules_format=rules_format,
        special=_sha(roles_clean),
        vocab_size=len(full),
        num_added=sum(base.get(idx) != content for idx, content in added.items()),
        special_tokens=tuple(sorted((k, str(v)) for k, v in roles_clean.items())),
        files=tuple(used),
    )


def fingerprint_dir(folder: Path | str) -> TokenizerFingerprint | None:
    """Fingerprint the tokenizer in ``folder``, or ``None`` when it has no tokenizer files."""
    files = find_tokenizer_files(Path(folder))
    return fingerprint_files(files) if files else None
