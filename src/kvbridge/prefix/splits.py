"""Exact-token splits: where a hidden prefix may end so that ``ghost + live == joint``.

A character concatenation point is not necessarily a token boundary. Encoding
``guide + " "`` and ``live`` separately (the *naive* split) can give a different token
sequence than encoding ``guide + " " + live`` jointly: byte-level BPE (GPT-2, Qwen2) turns the
trailing space of the first piece into its own token, where the joint encoding glues it to the
next word (``"Ġword"``). A KV prefix computed from the naive ghost is then the state of a
*different* token sequence than the visible prompt it is compared with.

:func:`split_text` reports three encodings of ``guide + sep + live``:

- ``joint``: the whole text encoded at once (special tokens added as the tokenizer does),
- ``naive``: ``encode(guide + sep)`` + ``encode(live)``,
- ``safe``: found by backing up from the append point to a boundary where re-encoding the
  tail reproduces the joint ids. The end of the guide is tried first (ghost = the guide,
  live = ``sep + live``: what a prefix pack of the guide needs), then the append point
  (ghost = ``guide + sep``), then the character positions and the joint-token start offsets
  just before them, closest first; each candidate is verified by encoding the
  ghost text and the tail text separately and comparing *every* id with the joint encoding
  (the ghost's ids with the joint's leading ids, the tail's ids with the rest: the overlap
  around the append point is checked, not assumed). When no candidate reproduces the joint
  ids the report says so (``safe`` is None and ``reason`` says why).

Special tokens follow ``add_special_tokens``: the ghost carries what the tokenizer puts in
front (BOS), the live part never does, and whatever the tokenizer appends (EOS for a few
tokenizers) belongs to the live part. Tokenizers are opened by :mod:`kvbridge.models.tokenizer_load`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from kvbridge.divergence import first_divergence
from kvbridge.errors import KVBridgeError

#: characters and joint tokens searched before the append point for a safe boundary
WINDOW_CHARS = 32
WINDOW_TOKENS = 12


class SplitError(KVBridgeError):
    """No split of the text reproduces the joint token ids (or the text is unusable)."""


# -- encoding ------------------------------------------------------------------------------------
def encode(tokenizer: Any, text: str, *, add_special_tokens: bool) -> list[int]:
    """Token ids of ``text`` (a transformers tokenizer or a ``tokenizers.Tokenizer``)."""
    if hasattr(tokenizer, "encode_batch") and not hasattr(tokenizer, "convert_ids_to_tokens"):
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def _offsets(tokenizer: Any, text: str) -> list[tuple[int, int]] | None:
    try:
        if hasattr(tokenizer, "encode_batch") and not hasattr(tokenizer, "convert_ids_to_tokens"):
            return [tuple(o) for o in tokenizer.encode(text, add_special_tokens=True).offsets]
        return [
            tuple(o) for o in tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)["offset_mapping"]
        ]
    except Exception:  # noqa: BLE001 - slow tokenizers have no offsets: characters only
        return None


def special_affixes(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(prefix, suffix)``: the ids ``add_special_tokens=True`` puts around a plain text."""
    probe = "hello world"
    with_sp = encode(tokenizer, probe, add_special_tokens=True)
    plain = encode(tokenizer, probe, add_special_tokens=False)
    n = len(plain)
    for i in range(len(with_sp) - n + 1):
        if with_sp[i : i + n] == plain:
            return tuple(with_sp[:i]), tuple(with_sp[i + n :])
    return (), ()


def strip_suffix(ids: list[int], suffix: Sequence[int]) -> list[int]:
    if suffix and len(ids) >= len(suffix) and tuple(ids[-len(suffix) :]) == tuple(suffix):
        return ids[: -len(suffix)]
    return ids


# -- reports -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Split:
    """One way of encoding the text in two pieces: the ghost (hidden prefix) and the live part."""

    kind: str  # "naive" or "safe"
    ghost: tuple  # ids of the ghost, with the tokenizer's leading special tokens (BOS)
    live: tuple  # ids of the live part, without leading special tokens
    ghost_text: str
    live_text: str
    matches_joint: bool
    first_difference: int | None  # first joint index where ghost + live differs (None if equal)
    boundary: int  # character offset in the joint text where the ghost text ends
    backed_up_chars: int = 0  # append point minus boundary
    note: str = ""

    @property
    def ids(self) -> tuple:
        return self.ghost + self.live

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "ghost": list(self.ghost),
            "live": list(self.live),
            "ghost_text": self.ghost_text,
            "live_text": self.live_text,
            "ghost_len": len(self.ghost),
            "live_len": len(self.live),
            "total_len": len(self.ids),
            **{k: getattr(self, k) for k in "matches_joint first_difference boundary backed_up_chars note".split()},
        }


@dataclass(frozen=True)
class SplitReport:
    """Joint encoding, naive split and safe split of ``guide + sep + live``."""

    guide: str
    live: str
    sep: str
    joint: tuple
    naive: Split
    safe: Split | None
    reason: str = ""  # why there is no safe split ("" when there is one)
    special_prefix: tuple = ()
    special_suffix: tuple = ()
    candidates_tried: int = 0
    tokenizer: str = ""
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def text(self) -> str:
        return self.guide + self.sep + self.live

    @property
    def append_point(self) -> int:
        return len(self.guide) + len(self.sep)

    def get(self, kind: str) -> Split:
        """The ``"safe"`` (exact; raises when none exists) or ``"naive"`` split."""
        if kind == "naive":
            return self.naive
        if kind != "safe":
            raise SplitError(f"unknown split kind {kind!r}", "use 'safe' or 'naive'")
        return self.require_safe()

    def require_safe(self) -> Split:
        """The safe split, asserting ``ghost + live == joint`` id for id."""
        if self.safe is None:
            raise SplitError(
                f"no exact-token split of the guide and the live text exists: {self.reason}",
                "change the separator (e.g. --sep ' ' or '\\n') or end the guide at a word boundary",
            )
        if self.safe.ids != self.joint:
            raise SplitError("safe split does not reproduce the joint token ids", "report this as a kvbridge bug")
        return self.safe

    def to_dict(self) -> dict:
        none = {"kind": "safe", "ghost": [], "live": [], "matches_joint": False}
        safe = {**(self.safe.to_dict() if self.safe else none), "found": self.safe is not None}
        return {
            **{k: getattr(self, k) for k in ("tokenizer", "guide", "live", "sep", "append_point")},
            "joint": list(self.joint),
            "joint_len": len(self.joint),
            "special_prefix": list(self.special_prefix),
            "special_suffix": list(self.special_suffix),
            "naive": self.naive.to_dict(),
            "safe": safe,
            "safe_found": self.safe is not None,
            "reason": self.reason,
            "candidates_tried": self.candidates_tried,
        }

    def lines(self) -> list[str]:
        """A short human-readable report."""
        n, s = self.naive, self.safe
        out = [
            f"joint: {len(self.joint)} tokens",
            f"naive: {len(n.ghost)} + {len(n.live)} = {len(n.ids)} tokens  "
            f"ghost+live == joint: {'yes' if n.matches_joint else 'NO'}"
            + ("" if n.matches_joint else f" (first difference at token {n.first_difference})"),
        ]
        if s is None:
            out.append(f"safe:  none exists: {self.reason}")
        else:
            where = "at the append point" if s.backed_up_chars == 0 else f"backed up {s.backed_up_chars} chars"
            out.append(
                f"safe:  {len(s.ghost)} + {len(s.live)} = {len(s.ids)} tokens  ghost+live == joint: yes "
                f"(boundary at char {s.boundary}, {where}; live text {s.live_text[:40]!r}"
                f"{'...' if len(s.live_text) > 40 else ''})" + (f"; {s.note}" if s.note else "")
            )
        return out


def split_text(tokenizer: Any, guide: str, live: str, sep: str = " ") -> SplitReport:
    """Joint, naive and safe encodings of ``guide + sep + live`` (see the module docstring)."""
    if not guide or not guide.strip():
        raise SplitError("the guide is empty", "pass a non-empty --guide TEXT (or @FILE)")
    if not live or not live.strip():
        raise SplitError("the live text is empty", "pass a non-empty live text / prompt")
    text = guide + sep + live
    prefix, suffix = special_affixes(tokenizer)
    joint = tuple(encode(tokenizer, text, add_special_tokens=True))
    A = len(guide) + len(sep)

    def attempt(kind: str, ghost_text: str, live_text: str, boundary: int, note: str = "") -> Split:
        ghost = strip_suffix(encode(tokenizer, ghost_text, add_special_tokens=True), suffix)
        tail = list(encode(tokenizer, live_text, add_special_tokens=False)) + list(suffix)
        ids = tuple(ghost) + tuple(tail)
        first = first_divergence(ids, joint)
        if first is None and len(ids) != len(joint):  # one is a prefix of the other
            first = min(len(ids), len(joint))
        return Split(
            kind=kind,
            ghost=tuple(ghost),
            live=tuple(tail),
            ghost_text=ghost_text,
            live_text=live_text,
            matches_joint=first is None,
            first_difference=first,
            boundary=boundary,
            backed_up_chars=A - boundary,
            note=note,
        )

    naive = attempt("naive", guide + sep, live, A)

    # candidate boundaries: characters backing up from the append point, and joint-token starts
    offsets = _offsets(tokenizer, text)
    spans = list(zip(offsets, joint)) if offsets and len(offsets) == len(joint) else []
    starts = [start for (start, end), _ in spans if end > start and start <= A]
    candidates = {*range(A, max(0, A - WINDOW_CHARS) - 1, -1), len(guide), *starts[-WINDOW_TOKENS:]}
    # the guide's own end first (ghost = exactly the guide, as a prefix pack stores it), then the
    # append point (ghost = guide + sep), then every other candidate backing up from there
    first = [c for c in dict.fromkeys((len(guide), A)) if 0 < c < len(text)]
    order = first + sorted((c for c in candidates if 0 < c < len(text) and c not in first), reverse=True)
    try:  # a SentencePiece dummy prefix: "x" and " x" encode alike
        dummy = encode(tokenizer, "x", add_special_tokens=False) == encode(tokenizer, " x", add_special_tokens=False)
    except Exception:  # noqa: BLE001
        dummy = False

    def attempts():  # each candidate, then (dummy prefix) the same without the live text's leading space
        for c in order:
            yield attempt("safe", text[:c], text[c:], c)
            if dummy and text[c : c + 1] == " " and c + 1 < len(text):
                note = "the live text drops the leading space: the tokenizer's dummy prefix supplies it"
                yield attempt("safe", text[:c], text[c + 1 :], c, note=note)

    tried = 0
    for tried, safe in enumerate(attempts(), 1):
        if safe.matches_joint:
            break
    else:
        safe = None
    if safe is not None and safe.boundary < len(guide):
        moved = guide[safe.boundary :]
        extra = f"the boundary is inside the guide: the live text carries its last {len(moved)} characters {moved!r}"
        safe = replace(safe, note=f"{safe.note}; {extra}" if safe.note else extra)
    reason = ""
    if safe is None:
        cut = next(((a, b, t) for (a, b), t in spans if a < A < b), None)  # the joint token across the point
        straddle = (
            f"; joint token {cut[2]} spans characters {cut[0]}-{cut[1]} across the append point {A}" if cut else ""
        )
        reason = (
            f"no boundary within {WINDOW_CHARS} characters or {WINDOW_TOKENS} tokens before the append point "
            f"re-encodes to the joint ids ({tried} candidates tried){straddle}"
        )
    return SplitReport(
        guide=guide,
        live=live,
        sep=sep,
        joint=joint,
        naive=naive,
        safe=safe,
        reason=reason,
        special_prefix=prefix,
        special_suffix=suffix,
        candidates_tried=tried,
        tokenizer=str(getattr(tokenizer, "name_or_path", "") or ""),
    )


def exact_split(tokenizer: Any, guide: str, live: str, sep: str = " ") -> tuple[SplitReport, Split]:
    """``(report, safe split)`` with ``ghost + live == joint`` (:meth:`SplitReport.require_safe`), or a SplitError."""
    report = split_text(tokenizer, guide, live, sep)
    return report, report.require_safe()


def read_text_arg(value: str, what: str = "text") -> str:
    """``TEXT`` as given, ``@FILE`` read from a file (``@@...`` for a literal leading ``@``)."""
    from kvbridge.check.validate import cli_text

    value = cli_text(value, what)  # bytes that are not UTF-8 arrive as surrogates: refuse them here
    if value.startswith("@@"):
        return value[1:]
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KVBridgeError(
                f"cannot read {what} file {path}: {getattr(exc, 'strerror', None) or exc}",
                f"pass --{what} TEXT or @FILE with a readable UTF-8 file",
            ) from None
    return value
