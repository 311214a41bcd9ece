"""kvbridge's own measured verdicts per model pair: what a transfer did on that very pair.

Published figures (:mod:`kvbridge.builtin.compat_checks`, ``known-results``) describe other pairs;
the records in ``manifests/results/`` (one JSON file per pair, schema
``manifests/schemas/measured-result.schema.json``) say what kvbridge itself measured, each number
beside the command that produced it and the transfer beside the source model alone.
``kvbridge check`` and ``kvbridge fit --plan`` show the record of the pair they are asked about.

A record matches a side by name, case-insensitively: the reference as typed, the resolved name,
the GGUF file's name or the model folder's name, against the record's ``names``. Config-only: no
torch, no transformers.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from kvbridge.check.sources import REPO_MANIFESTS
from kvbridge.check.validate import load_json
from kvbridge.errors import ConfigError

#: kvbridge's own measured results (package data beside manifests/models)
REPO_RESULTS = REPO_MANIFESTS.parent / "results"
RECORD_KEYS = {
    "$schema",
    "source",
    "target",
    "verdict",
    "summary",
    "kvbridge_version",
    "results",
    "measurements",
    "notes",
}
MEASUREMENT_KEYS = {"metric", "transferred", "source_alone", "detail", "command", "results"}


@dataclass(frozen=True)
class Measured:
    """One pair's record: ``verdict`` in a few words, ``measurements`` (dicts with ``metric``,
    ``transferred``, ``source_alone``, ``detail``, ``command``), ``results`` (where the full
    protocol is written), ``path`` (the record file)."""

    source: str
    target: str
    verdict: str
    summary: str
    measurements: tuple
    results: str
    path: str
    notes: str = ""

    def to_dict(self) -> dict:
        return {
            **{name: getattr(self, name) for name in ("source", "target", "verdict", "summary")},
            "measurements": [dict(m) for m in self.measurements],
            "results": self.results,
            "record": self.path,
            "notes": self.notes,
        }

    def lines(self, width: int = 100) -> list[str]:
        """The record as text: the verdict, one line per measurement (transfer vs the source alone),
        each with the command that produced it."""

        wrapper = textwrap.TextWrapper(width, break_on_hyphens=False, break_long_words=False)  # paths, flags kept whole

        def wrap(text: str, first: str, rest: str) -> list[str]:
            wrapper.initial_indent, wrapper.subsequent_indent = first, rest
            return wrapper.wrap(text)

        out = [f"measured by kvbridge on this pair: {self.verdict} ({self.source} -> {self.target})"]
        out += wrap(self.summary, "  ", "  ")
        for m in self.measurements:
            line = f"{m['metric']}: transferred {m['transferred']:.3f} vs source alone {m['source_alone']:.3f}"
            out += wrap(line + (f" ({m['detail']})" if m.get("detail") else ""), "  - ", "    ")
            if m.get("command"):
                out += wrap("command: " + m["command"], "    ", "      ")
        out += wrap(f"({self.results}; record {Path(self.path).name})", "  ", "  ")
        if self.notes:
            out += wrap(self.notes, "  ", "  ")
        return out


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} must be a number, got {value!r}", "fix the record (manifests/results/)")
    return float(value)


def validate_record(record: Any, path) -> Measured:
    """A :class:`Measured` from a parsed record; a one-line error naming the file and field otherwise."""
    fix = "fix the record (see manifests/schemas/measured-result.schema.json)"
    if not isinstance(record, dict):
        raise ConfigError(f"{path}: a measured result must be a JSON object", fix)
    extra = sorted(set(record) - RECORD_KEYS)
    if extra:
        raise ConfigError(f"{path}: unknown field {extra[0]!r}", fix)
    for side in ("source", "target"):
        names = (record.get(side) or {}).get("names") if isinstance(record.get(side), dict) else None
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(f"{path}: {side}.names must be a non-empty list of model names", fix)
    for key in ("verdict", "summary", "results"):
        if not isinstance(record.get(key), str) or not record[key].strip():
            raise ConfigError(f"{path}: field {key!r} must be a non-empty string", fix)
    ms = record.get("measurements")
    if not isinstance(ms, list) or not ms:
        raise ConfigError(f"{path}: 'measurements' must be a non-empty list", fix)
    out = []
    for i, m in enumerate(ms):
        where = f"{path}: measurements[{i}]"
        if not isinstance(m, dict) or set(m) - MEASUREMENT_KEYS:
            raise ConfigError(f"{where} must hold only {', '.join(sorted(MEASUREMENT_KEYS))}", fix)
        for key in ("metric", "command"):
            if not isinstance(m.get(key), str) or not m[key].strip():
                raise ConfigError(f"{where}.{key} must be a non-empty string (the command that measured it)", fix)
        out.append(m | {key: _number(m.get(key), f"{where}.{key}") for key in ("transferred", "source_alone")})
    label = lambda side: record[side].get("label") or record[side]["names"][0]  # noqa: E731
    return Measured(
        source=label("source"),
        target=label("target"),
        **{k: record[k] for k in ("verdict", "summary", "results")},
        measurements=tuple(out),
        path=str(path),
        notes=str(record.get("notes") or ""),
    )


def load_records(folder: Path | str | None = None) -> list[tuple[dict, Measured]]:
    """Every record in ``folder`` (default :data:`REPO_RESULTS`): ``(raw record, Measured)``, by file name."""
    folder = Path(REPO_RESULTS if folder is None else folder)
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    out = []
    for p in paths:
        raw = load_json(p, what="measured result record", object_only=False)
        out.append((raw, validate_record(raw, p)))
    return out


def names_of(resolved) -> set[str]:
    """The names a resolved reference answers to (lower case): as typed, its name, its GGUF file's
    name, its folder's name."""
    names = {getattr(resolved, "ref", ""), getattr(resolved, "name", "")}
    names |= {Path(value).name for attr in ("gguf_file", "folder") if (value := getattr(resolved, attr, None))}
    return {n.strip().lower() for n in names if n and n.strip()}


def measured_for(source: Iterable[str], target: Iterable[str], folder: Path | str | None = None) -> list[Measured]:
    """The records whose source matches a name in ``source`` and target one in ``target``
    (each a set of names, e.g. :func:`names_of` a resolved reference)."""
    src, tgt = {n.lower() for n in source}, {n.lower() for n in target}
    return [
        m
        for raw, m in load_records(folder)
        if src & {n.lower() for n in raw["source"]["names"]} and tgt & {n.lower() for n in raw["target"]["names"]}
    ]
