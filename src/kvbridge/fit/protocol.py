"""What a fitter is: :class:`FitterProtocol`, its options dataclass, and the :class:`FitReport` it returns.

A fitter is a class with three members::

    @dataclass(frozen=True)
    class MyOptions:                 # every option, typed, with its default
        top_k: int = 4
        alpha: float = 0.01

    class MyFitter:
        name = "mine"                # the --fitter value
        Options = MyOptions          # a frozen dataclass
        def fit(self, source_spec, target_spec, calibration, options: MyOptions):
            ...                      # -> FittedMapping whose .report is a FitReport

``kvbridge fit -o key=value`` (repeatable) fills the options generically: each value is
coerced to its field's type (``int``, ``float``, ``bool``, ``str``, JSON for ``dict``/``list``,
``none`` for an optional field, the first type that takes it for a union such as
``float | str``); an unknown key is refused with the closest names. The options'
``__post_init__`` may refuse bad values with a one-line error. Torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable

from kvbridge.errors import ConfigError, did_you_mean

from kvbridge.plugin_types import FITTER_MEMBERS, fitter_problem  # noqa: F401  (checked when it registers)


@runtime_checkable
class FitterProtocol(Protocol):
    """``name`` (the ``--fitter`` value), ``Options`` (a frozen dataclass of its options) and
    ``fit(source_spec, target_spec, calibration, options) -> mapping``.

    ``calibration`` is a :class:`kvbridge.fit.calibrate.PairedCalibration` (streamed statistics
    through ``accumulate``, or a materialised ``sample``), or ``None`` for a fitter that needs
    no data. The mapping has ``map_content(state, target_spec)`` and ``exact``; a stored one is a
    :class:`kvbridge.fit.mapping.FittedMapping` whose ``report`` is a :class:`FitReport`.
    """

    name: str
    Options: type

    def fit(self, source_spec: Any, target_spec: Any, calibration: Any, options: Any) -> Any: ...


@dataclass(frozen=True)
class FitReport:
    """What a fit measured (stored in the mapping's manifest; JSON-ready values)."""

    fitter: str
    params: dict = field(default_factory=dict)  # the options as used (defaults resolved)
    layer_selection: list = field(default_factory=list)  # per target layer: source layers (or (layer, head) pairs)
    selection_scores: dict | None = None  # the scores the selection was made on
    heldout_r2: dict = field(default_factory=lambda: {"k": None, "v": None})  # [target layer][head] per K / V
    r2_summary: dict = field(default_factory=dict)  # heldout, mean, mean_k, mean_v, min
    alpha_chosen: list | None = None  # ridge strength per target layer (K, V)
    observations: dict = field(default_factory=dict)  # train (and heldout) observations, features per head
    passes: list = field(default_factory=list)  # one record per pass over the corpus
    warnings: tuple = ()  # poor fits, unmeasured quality
    training: dict = field(default_factory=dict)  # a trained fitter's losses (before/after, held-out)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "warnings": list(self.warnings)}

    @classmethod
    def from_dict(cls, data: Mapping) -> "FitReport":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in dict(data).items() if k in names and v is not None}
        kw.setdefault("fitter", "")
        kw["warnings"] = tuple(kw.get("warnings", ()))
        return cls(**kw)


# -- options -----------------------------------------------------------------------------------
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _union_args(tp: Any) -> tuple:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _coerce_one(raw: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp) or tp
    if tp is type(None):
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("none", "null", "")):
            return None
        raise ValueError("not none")
    if tp is Any:
        return raw
    if not isinstance(raw, str):  # a Python value (the API): accept it when it has the type
        if origin is float and isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(origin, type) and isinstance(raw, origin) and not (origin is int and isinstance(raw, bool)):
            return raw
        raise ValueError(f"not a {getattr(origin, '__name__', origin)}")
    if origin is bool:
        low = raw.strip().lower()
        if low in _TRUE | _FALSE:
            return low in _TRUE
        raise ValueError("not a boolean")
    if origin in (int, float, str):
        return origin(raw)
    if origin in (dict, list, tuple):
        value = json.loads(raw)
        if not isinstance(value, dict if origin is dict else list):
            raise ValueError(f"not a JSON {'object' if origin is dict else 'array'}")
        return tuple(value) if origin is tuple else value
    raise ValueError(f"unsupported option type {tp!r}")


def type_name(tp: Any) -> str:
    return " | ".join(
        "none" if a is type(None) else getattr(typing.get_origin(a) or a, "__name__", str(a)) for a in _union_args(tp)
    )


def coerce(raw: Any, tp: Any, *, key: str, owner: str) -> Any:
    """``raw`` (a string from the command line, or a Python value) as type ``tp``."""
    for arg in sorted(_union_args(tp), key=lambda a: a is not type(None)):  # "none" first, then as declared
        try:
            return _coerce_one(raw, arg)
        except (ValueError, TypeError, json.JSONDecodeError):
            continue
    raise ConfigError(f"{owner} option {key}={raw!r} is not a {type_name(tp)}", f"pass -o {key}=<{type_name(tp)}>")


def option_fields(cls: type) -> dict:
    """``{name: (type, default)}`` of an options dataclass."""
    hints, none = typing.get_type_hints(cls), dataclasses.MISSING

    def default(f):
        return f.default if f.default is not none else (None if f.default_factory is none else f.default_factory())

    return {f.name: (hints.get(f.name, Any), default(f)) for f in dataclasses.fields(cls)}


def parse_pairs(pairs) -> dict:
    """``["a=1", "b=x"]`` (``-o`` values) -> ``{"a": "1", "b": "x"}``; a pair without ``=`` is refused."""
    out: dict = {}
    for item in pairs or ():
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"-o {item!r} is not key=value", "pass e.g. -o top_k=4")
        out[key.strip().replace("-", "_")] = value
    return out


def build_options(cls: type, values: Mapping | None = None, *, owner: str = "fitter") -> Any:
    """An instance of the options dataclass ``cls`` from ``values`` (strings or Python values).

    Unknown keys are refused naming the closest ones; values are coerced to the field types.
    """
    fields = option_fields(cls)
    kw = {}
    for key, raw in dict(values or {}).items():
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise ConfigError(f"{owner} has no option {key!r}", f"{did_you_mean(key, fields)}its options: {known}")
        kw[key] = coerce(raw, fields[key][0], key=key, owner=owner)
    try:
        return cls(**kw)
    except TypeError as exc:
        raise ConfigError(f"{owner} options rejected: {exc}", "check the -o values") from None


__all__ = [
    "FitterProtocol",
    "FitReport",
    "fitter_problem",
    "build_options",
    "parse_pairs",
    "coerce",
    "option_fields",
    "type_name",
    "FITTER_MEMBERS",
]
