"""How ``eval`` reads ``--corpus`` (``fit``'s side: :func:`kvbridge.corpus.calibration_texts`): a file as before, a folder split by file.

A folder corpus is split by :class:`kvbridge.corpus.Split` (a hash of each file's relative
path): ``fit`` reads the calibration part and records the split in the mapping; ``eval`` reads
the held-out part, with the mapping's split unless ``--heldout-fraction`` is given, and refuses
(one line, exit 2) a split whose held-out files include files the mapping could have calibrated
on, unless ``--allow-overlap``. A file corpus is split by position (:class:`kvbridge.corpus.Tail`):
``fit`` reads the text before the held-out tail and records it; ``eval`` reads the tail, with the
mapping's share unless ``--heldout-fraction`` is given, and refuses a tail that reaches into the
text the mapping calibrated on (:mod:`kvbridge.evaluate.overlap`). Both record the same corpus hash.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EvalCorpus:
    tail: str  # the text eval samples come from
    profile_texts: list = field(repr=False)  # text for recompute profiling (never the held-out part of a folder)
    data: dict = field(default_factory=dict)  # eval's data record (path, sha256, held-out share, split)
    note: str | None = None  # an --allow-overlap warning


def _recorded_tail(rec: dict, sha256: str) -> float | None:
    """The held-out share (``heldout_tail``) a mapping's ``calibration.corpus`` record ``rec`` holds for this file."""
    tail = rec.get("heldout_tail") or {}
    if rec.get("sha256") != sha256 or not tail.get("heldout"):
        return None
    try:
        share = float(tail["heldout"])
    except (TypeError, ValueError):
        return None
    return share if 0 < share < 1 else None


def eval_corpus(
    path, manifest: dict | None, fraction: float, *, explicit: bool, allow: bool, tokenizer=None
) -> EvalCorpus:
    """The held-out text ``eval`` samples from, refusing overlap with the mapping's calibration."""
    from kvbridge.corpus import Split, read_corpus, split_overlap
    from kvbridge.evaluate import heldout_text
    from kvbridge.evaluate.overlap import OverlapError, check

    corpus = read_corpus(path)
    cal = (manifest or {}).get("calibration") or {}
    rec = cal.get("corpus") or {}
    base = {"path": str(path), "sha256": corpus.sha256, "sha256_of": corpus.sha256_of}
    if corpus.kind == "file":
        texts = list(corpus.texts)
        if not explicit:  # the share the mapping held out of this very file, when it recorded one
            fraction = _recorded_tail(rec, corpus.sha256) or fraction
        note = check(manifest, path, texts, fraction, tokenizer=tokenizer, allow=allow)
        return EvalCorpus(heldout_text(texts, fraction), texts, {**base, "heldout_fraction": fraction}, note)
    same = corpus.sha256 in {rec.get("sha256"), cal.get("corpus_sha256")} - {None}
    fitted = Split.from_record(rec["split"]) if same and rec.get("split") else None
    what = None
    if fitted is not None:
        evaluated = Split(heldout=fraction if explicit else fitted.heldout, salt=fitted.salt)
        over = split_overlap(corpus, fitted, evaluated)
        if over:
            what = (
                f"{len(over)} of the held-out files at --heldout-fraction {evaluated.heldout:g} are calibration "
                f"files of the mapping (fitted with {fitted.heldout:g} of this folder held out), e.g. {over[0]!r}"
            )
    else:
        evaluated = Split(heldout=fraction)
        if same:
            what = (
                "the mapping was fitted on this folder without a recorded file split: any file may be calibration text"
            )
    if what and not allow:
        raise OverlapError(
            what,
            f"use --heldout-fraction {fitted.heldout:g} (the mapping's) or less, evaluate on "
            "another corpus, or pass --allow-overlap to measure anyway"
            if fitted is not None
            else "fit again with this kvbridge (it records the split), or pass --allow-overlap",
        )
    note = what + " (--allow-overlap: scores are optimistic)" if what else None
    texts = corpus.part_texts(evaluated, "heldout")
    data = {
        **base,
        "heldout_fraction": evaluated.heldout,
        "split": {
            **evaluated.record(),
            "heldout_files": len(texts),
            "files": len(corpus.files),
            "from_mapping": fitted is not None and not explicit,
        },
    }
    return EvalCorpus("\n".join(texts), corpus.part_texts(evaluated, "calibration"), data, note)
