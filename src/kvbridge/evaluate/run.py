"""``evaluate_pair(pair, settings)``: the library form of ``kvbridge eval``.

Reads the mapping (checked against the pair) and the corpus's held-out part (refusing overlap
with the mapping's calibration text), draws the samples, and runs either the conditions
(:func:`kvbridge.evaluate.evaluate`) or, with any ``recompute`` point, the recompute curve; a
``report_dir`` gets the report, a ``partial_path`` the finished batches as they come. Nothing is
printed: the result is an :class:`EvalRun`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kvbridge.errors import ConfigError

from kvbridge.evaluate.settings import HELDOUT_FRACTION, EvalSettings


@dataclass(frozen=True)
class ConditionSet:
    """Conditions a later stage runs in ``kvbridge eval``'s place when ``wanted(settings)``:
    ``run(run, mapping, ids, inputs, progress) -> (result, written)``, ``inputs`` holding the corpus's
    ``texts`` (the fit's side), the samples' ``data`` record and the ``source`` / ``target`` references."""

    name: str
    wanted: Callable
    run: Callable


@dataclass(frozen=True)
class EvalRun:
    """``result``: the eval (or a condition set's) result dict; ``written``: report files by name;
    ``kind``: ``eval``, or the :class:`ConditionSet` that ran (``recompute``: the recompute curve,
    ``frontier``: the compute frontier); ``exit_code``: 1 when an enforced gate failed."""

    result: dict = field(repr=False)
    written: dict = field(default_factory=dict)
    kind: str = "eval"

    @property
    def recompute(self) -> bool:
        return self.kind == "recompute"

    @property
    def frontier(self) -> bool:
        return self.kind == "frontier"

    @property
    def exit_code(self) -> int:
        return 0 if self.kind != "eval" else int(self.result.get("exit_code") or 0)

    @property
    def failed_gates(self) -> list[str]:
        return [g["gate"] for g in self.result.get("gates", ()) if g["enforced"] and not g["passed"]]


def mapping_of(run):
    """The mapping ``run.settings.mapping`` names, checked against the run's models (their identities,
    computed once per run, and the pair's tokenizer; a mismatch is refused unless the settings'
    ``accept_fingerprint_mismatch`` is set), or the identity mapping of the pair's specs."""
    s = run.settings
    if s.mapping == "identity":
        return run.host.get("fitter", "identity").fit(run.source.spec, run.target.spec)
    from kvbridge.fit.artifact import load_mapping
    from kvbridge.fit.pipeline import identity

    return load_mapping(
        s.mapping,
        source=identity(run, "source"),
        target=identity(run, "target"),
        tokenizer=run.tokenizer,
        force=getattr(s, "accept_fingerprint_mismatch", False),
        host=run.host,
    )


def evaluate_pair(pair, settings: EvalSettings, *, host=None, **callbacks) -> EvalRun:
    """:func:`evaluate_run` of ``settings`` on a loaded :class:`~kvbridge.models.pair.ModelPair`."""
    from kvbridge.run import Run

    return evaluate_run(Run.of(pair, settings, host), **callbacks)


def evaluate_run(run, *, progress=None, heartbeat=None, warn=None, condition_sets=()) -> EvalRun:
    """Run ``kvbridge eval`` on a :class:`~kvbridge.run.Run` (a loaded pair, the host, an :class:`EvalSettings`).

    ``progress(done, total)`` is called as samples finish; ``heartbeat`` (a
    :class:`kvbridge.progress.Heartbeat`, optional) is told the stages; ``warn(text)`` receives the
    overlap note of ``allow_overlap`` (it is also in the result's notes); ``condition_sets``: the
    :class:`ConditionSet` values that may run instead (``kvbridge.recompute.eval_run.CONDITION_SETS``:
    ``--frontier``, ``--recompute-*``)."""
    from kvbridge.evaluate.corpus import eval_corpus
    from kvbridge.evaluate import corpus_samples, evaluate_config
    from kvbridge.evaluate.report import batch_record, write_report
    from kvbridge.faults import fault_point
    from kvbridge.fit.calibrate import check_same_tokens
    from kvbridge.progress import PartialLog

    src, tgt, s = run.source, run.target, run.settings
    ttok = tgt.tokenizer
    if s.mapping is None or s.corpus is None:
        flag = "--mapping" if s.mapping is None else "--corpus"
        raise ConfigError(f"{flag} is not set", "pass EvalSettings(mapping=..., corpus=...) to evaluate a pair")
    if heartbeat is not None:
        heartbeat.stage("reading the corpus and the mapping")
    mapping = mapping_of(run)
    ev = eval_corpus(
        s.corpus,
        getattr(mapping, "manifest", None),
        HELDOUT_FRACTION if s.heldout_fraction is None else s.heldout_fraction,
        explicit=s.heldout_fraction is not None,
        allow=s.allow_overlap,
        tokenizer=ttok,
    )
    check_same_tokens([ev.tail], src.tokenizer, ttok)
    if ev.note and warn is not None:
        warn(ev.note)
    ids, data = corpus_samples([ev.tail], ttok, n=s.samples, length=s.sample_len, fraction=1.0)
    data.update(ev.data)
    refs = {"source": _ref_text(src), "target": _ref_text(tgt)}
    head = {"command": "eval", **refs, "mapping": s.mapping, "corpus": str(s.corpus), "samples": int(ids.shape[0])}
    head.update(prefix_len=s.prefix_len, continuation_len=s.continuation_len)
    partial = None if s.partial_file is None else PartialLog(s.partial_file, head)
    if heartbeat is not None:
        heartbeat.stage("evaluating", int(ids.shape[0]), "samples")

    def on_batch(first, last, fields):
        if partial is not None:
            partial.add(batch_record(first, last, fields))
        fault_point("eval.batch")

    for cs in condition_sets:  # a condition set of a later stage (kvbridge.recompute.eval_run) instead
        if cs.wanted(s):
            result, written = cs.run(run, mapping, ids, {"texts": ev.profile_texts, "data": data, **refs}, progress)
            close_partial(partial, s, written)
            return EvalRun(result, written, kind=cs.name)
    if s.frontier is not None or s.recompute.active:
        raise ConfigError(
            "--frontier and --recompute-* run the recompute stage's condition sets",
            "call kvbridge.api.evaluate_pair (or kvbridge.recompute.eval_run.evaluate_run)",
        )
    result = evaluate_config(
        (src.model, tgt.model),
        mapping,
        ids,
        s,
        host=run.host,
        progress=progress,
        on_batch=on_batch,
        labels={
            "source_name": src.name,
            "target_name": tgt.name,
            "mapping_path": None if s.mapping == "identity" else s.mapping,
            "data": data,
        },
    )
    if ev.note:
        result["notes"] = list(result.get("notes") or []) + [ev.note]
    verdict = {"gates_passed": result.get("gates_passed"), "exit_code": result.get("exit_code")}
    return EvalRun(result, write_and_close(result, s, write_report, partial, verdict))


def write_and_close(result: dict, settings, write, partial, summary: dict | None = None) -> dict:
    """``write(result, settings.report_dir)`` when a report is asked (the files written, else {}),
    then :func:`close_partial`."""
    written = write(result, settings.report_dir) if settings.report_dir else {}
    close_partial(partial, settings, written, summary)
    return written


def close_partial(partial, settings, written: dict, summary: dict | None = None) -> None:
    """The partial log (if any) removed once a report was ``written`` (the report holds everything),
    unless ``settings.partial_path`` named it: a file the user named is finished with ``summary``, never
    deleted."""
    if partial is not None:
        partial.remove() if written and settings.partial_path is None else partial.finish(summary)


def _ref_text(loaded) -> str:
    """The reference as the user gave it (``zoo:base``, a folder)."""
    return str(getattr(loaded.ref, "ref", None) or loaded.name)


__all__ = [
    "ConditionSet",
    "EvalRun",
    "close_partial",
    "EvalSettings",
    "evaluate_pair",
    "evaluate_run",
    "mapping_of",
    "write_and_close",
]
