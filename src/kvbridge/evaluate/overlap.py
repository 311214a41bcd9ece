"""Does an evaluation read text its mapping was fitted on?

``kvbridge fit`` records in the mapping which corpus it calibrated on (each file's sha256 as
``sha256sum`` prints it) and the span it read (``calibration.span``: characters, bytes and
tokens from the start of the corpus text). ``kvbridge eval`` samples from the corpus's
held-out tail (the last ``--heldout-fraction`` of the characters, from a line start). When the
eval corpus is the calibration corpus and the tail starts inside the calibration span, the
samples overlap calibration text and the scores are optimistic: ``eval`` **refuses** (exit 2)
unless ``--allow-overlap`` is given, and then says so in the result's notes and on stderr.

Older mappings without a span (they recorded the combined corpus hash and a token count)
get their span recomputed from the token count with the target's tokenizer.
"""

from __future__ import annotations

from typing import Any

from kvbridge.corpus import calibration_span, corpus_record, heldout_start, load_corpus  # heldout_start: re-exported
from kvbridge.errors import KVBridgeError


class OverlapError(KVBridgeError):
    """Evaluation samples overlap the mapping's calibration text."""


def calibration_overlap(
    manifest: dict | None, corpus_path, texts: list[str], fraction: float, tokenizer=None
) -> dict | None:
    """``{"calibration_chars": [0, end], "eval_chars": [start, total], "overlap_chars": n}`` when the
    eval samples come from text the mapping calibrated on, else None."""
    cal = (manifest or {}).get("calibration") or {}
    if not cal:
        return None
    rec = corpus_record(corpus_path)
    want = {cal.get("corpus_sha256"), (cal.get("corpus") or {}).get("sha256")} - {None}
    # mappings from before corpus records hold the combined hash of load_corpus
    if rec["sha256"] not in want and load_corpus(corpus_path)[1] not in want:
        return None
    span = cal.get("span")
    if not span and tokenizer is not None and cal.get("tokens"):
        span = calibration_span(list(texts), tokenizer, int(cal["tokens"]))
    if not span:
        return None
    end = int(span["chars"][1])
    start = heldout_start(texts, fraction)
    total = sum(len(t) for t in texts) + max(0, len(texts) - 1)
    if end <= start:
        return None
    return {
        "calibration_chars": [0, end],
        "eval_chars": [start, total],
        "overlap_chars": end - start,
        "corpus_sha256": rec["sha256"],
    }


def check(manifest: Any, corpus_path, texts, fraction: float, *, tokenizer=None, allow: bool = False) -> str | None:
    """Refuse (or, with ``allow``, return a warning for) eval samples inside the calibration span."""
    ov = calibration_overlap(manifest, corpus_path, texts, fraction, tokenizer)
    if ov is None:
        return None
    c, e = ov["calibration_chars"], ov["eval_chars"]
    what = (
        f"eval samples overlap the mapping's calibration text: the mapping was fitted on characters "
        f"{c[0]}-{c[1]} of this corpus (sha256 {ov['corpus_sha256'][:12]}...) and eval reads {e[0]}-{e[1]}"
    )
    if not allow:
        max_frac = max(0.0, 1 - c[1] / max(1, e[1]))
        raise OverlapError(
            what,
            f"use a --heldout-fraction below {max_frac:.3f}, evaluate on other text, fit with "
            "fewer --tokens, or pass --allow-overlap to measure anyway",
        )
    return what + " (--allow-overlap: scores are optimistic)"


__all__ = ["OverlapError", "calibration_overlap", "check", "heldout_start"]
