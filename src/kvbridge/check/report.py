"""A compatibility report: its rows (:class:`Axis`), the :class:`Report`, and how plugin
findings merge into the rows and the rows into the overall verdict.

The verdict rules are documented in :mod:`kvbridge.check.compat`, which builds reports
(:func:`kvbridge.check.compat.check`) and re-exports these names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from kvbridge.spec import ModelSpec

AXES = (
    "model",
    "layers",
    "kv_heads",
    "head_dim",
    "positional",
    "rope",
    "attention",
    "dtype",
    "cache_format",
    "tokenizer",
)
AXIS_VERDICTS = ("same", "mappable", "blocking")
VERDICTS = ("identity", "rope-reapply", "mappable", "incompatible")
#: axes whose "mappable" verdict means a fitted mapping
FITTED_AXES = ("model", "layers", "kv_heads", "head_dim")
#: axes whose "mappable" verdict means RoPE must be stripped and re-applied
POSITION_AXES = ("positional", "rope")
#: severity of verdicts (core and plugin ones) when findings are merged
SEVERITY = {"same": 0, "info": 0, "warning": 1, "mappable": 2, "blocking": 3}


@dataclass(frozen=True)
class Axis:
    """One row of a report."""

    name: str
    source: Any  # JSON-serialisable value on the source side
    target: Any
    verdict: str  # same | mappable | blocking (plugin axes may also say info | warning)
    action: str  # what a transfer must do about it
    plugin: str = ""  # the plugin that contributed (or escalated) this row, "" for core checks

    def to_dict(self) -> dict:  # the plugin is not part of the --json row
        return {f: getattr(self, f) for f in ("name", "source", "target", "verdict", "action")}


def spec_dict(spec: ModelSpec, name: str = "") -> dict:
    """The report's ``<spec>``: ``ModelSpec.to_dict()`` (rope sub-dict included), plus ``name``."""
    return {"name": name, **spec.to_dict()} if name else spec.to_dict()


@dataclass(frozen=True)
class Report:
    """A compatibility report; :meth:`to_dict` is the stable ``--json`` shape."""

    source: ModelSpec
    target: ModelSpec
    axes: tuple  # of Axis, core axes first in AXES order, then plugin axes
    verdict: str  # one of VERDICTS
    reasons: tuple  # of str
    findings: tuple = ()  # the plugin findings as returned (Finding objects)
    source_name: str = ""
    target_name: str = ""
    measured: tuple = ()  # kvbridge's own measured verdicts on this very pair (kvbridge.check.measured)

    @property
    def ok(self) -> bool:
        """True when a transfer is possible (the verdict is not ``incompatible``)."""
        return self.verdict != "incompatible"

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(f"no axis {name!r} (axes: {', '.join(a.name for a in self.axes)})")

    def strict_failures(self) -> list[str]:
        """What ``--strict`` refuses: anything but an exact transfer with every fact known.

        An exact transfer is ``identity`` or ``rope-reapply``; strict also refuses a mappable
        note on any other axis (dtype cast, attention window, cache format, unknown or
        partially matching tokenizer) and every plugin ``warning``.
        """
        out = [] if self.verdict in ("identity", "rope-reapply") else [f"verdict is {self.verdict}"]
        return out + [
            f"{a.name}: {a.verdict}"
            for a in self.axes
            if a.name not in POSITION_AXES + FITTED_AXES and a.verdict in ("mappable", "warning")
        ]

    def exit_code(self, strict: bool = False) -> int:
        """0 when a transfer is possible, 1 when incompatible (or any strict failure)."""
        return 1 if not self.ok or (strict and self.strict_failures()) else 0

    def to_dict(self) -> dict:
        return {
            "source": spec_dict(self.source, self.source_name),
            "target": spec_dict(self.target, self.target_name),
            "axes": [a.to_dict() for a in self.axes],
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "measured": [m.to_dict() for m in self.measured],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)


# -- merging findings -------------------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _merge(axes: list[Axis], findings) -> list[Axis]:
    by_name = {a.name: i for i, a in enumerate(axes)}
    out = list(axes)
    for f in findings:
        tag = f" [plugin: {f.plugin}]" if f.plugin else ""
        if f.axis in by_name and f.verdict in AXIS_VERDICTS:
            i = by_name[f.axis]
            a = out[i]
            if SEVERITY.get(f.verdict, 0) > SEVERITY.get(a.verdict, 0):
                out[i] = Axis(a.name, a.source, a.target, f.verdict, f"{f.message}{tag}; {a.action}", f.plugin)
            else:
                out[i] = Axis(a.name, a.source, a.target, a.verdict, f"{a.action}; {f.message}{tag}", a.plugin)
            continue
        out.append(
            Axis(f.axis, _jsonable(f.source_value), _jsonable(f.target_value), f.verdict, f"{f.message}{tag}", f.plugin)
        )
    return out


def _overall(axes: list[Axis]) -> tuple[str, list[str]]:
    blocking = [a for a in axes if a.verdict == "blocking"]
    notes = [
        f"{a.name}: {a.action}"
        for a in axes
        if a.verdict == "mappable" and a.name not in FITTED_AXES + POSITION_AXES and a.name in AXES
    ]
    warnings = [f"{a.verdict}: {a.action}" for a in axes if a.verdict == "warning"]  # info stays in the rows
    if blocking:
        return "incompatible", [f"{a.name}: {a.action}" for a in blocking] + warnings
    fitted = [a for a in axes if a.verdict == "mappable" and (a.name in FITTED_AXES or a.name not in AXES)]
    positional = [a for a in axes if a.verdict == "mappable" and a.name in POSITION_AXES]
    if fitted:
        pos = next((a for a in axes if a.name == "positional"), None)
        kinds = {pos.source, pos.target} if pos is not None else {"rope"}
        if kinds == {"rope"}:
            how = "strip the source RoPE, map K and V per target layer and head in content space, apply the target RoPE"
        elif "rope" in kinds:
            how = "map K and V per target layer and head in content space, stripping / applying RoPE on the side that has it"
        else:
            how = "map K and V per target layer and head; positions stay where the source computed them"
        reasons = [f"a fitted mapping is needed ({', '.join(a.name for a in fitted)}): {how}"]
        reasons += [f"{a.name}: {a.source} -> {a.target}: {a.action}" for a in fitted]
        return "mappable", reasons + notes + warnings
    if positional:
        reasons = [
            "same architecture and cache geometry, positions differ: strip the source RoPE from the"
            " keys and apply the target's; values transfer as they are"
        ]
        reasons += [f"{a.name}: {a.action}" for a in positional]
        return "rope-reapply", reasons + notes + warnings
    reasons = ["same architecture, cache geometry and positions: the cache is reused as it is"]
    model = next((a for a in axes if a.name == "model"), None)
    if model is not None and not model.action.startswith("same model"):
        reasons.append(
            f"model: {model.action}; weights are not compared, so identity is exact only for"
            " the same checkpoint (measure other checkpoints with `kvbridge eval --mapping identity`)"
        )
    return "identity", reasons + notes + warnings
