"""Small frozen records that plugins register or return (no torch)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

VERDICTS = ("same", "mappable", "blocking", "info", "warning")


@dataclass(frozen=True)
class Finding:
    """One line of a compatibility report, from the core checks or a plugin."""

    axis: str  # "layers", "kv_heads", ... or a plugin's own axis name
    verdict: str  # one of VERDICTS
    message: str  # what a transfer must do about it
    source_value: Any = None
    target_value: Any = None
    plugin: str = ""  # filled in by the host


def load_object(path: str) -> Any:
    """Import ``"package.module:attr"`` lazily."""
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Fitter:
    """A mapping fitter, loaded from ``factory`` ("module:attr") when used."""

    name: str
    description: str
    factory: str

    def load(self) -> Any:
        return load_object(self.factory)


@dataclass(frozen=True)
class Metric:
    """A quality metric, loaded from ``factory`` ("module:attr") when used."""

    name: str
    description: str
    factory: str
    higher_is_better: bool = False

    def load(self) -> Any:
        return load_object(self.factory)
