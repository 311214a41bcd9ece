"""Settings fields that declare their command-line option: flag, type, default, help, once.

A stage's frozen settings dataclass (``FitSettings``, ``EvalSettings``, ...) declares each field with
:func:`option`; ``kvbridge.cli.options.settings_options`` builds the click options from these
declarations (in field order) and ``settings_from`` builds the settings from the parsed values, so
the command line and the Python API cannot drift apart. The ``kind`` of a field is click-free (a
tuple: ``("count", 2)``, ``("real", 0, 1, {"max_open": True})``, ``"seed"``, ``"share"``,
``("path", {"exists": True})``, ``("choice", names)``, ...): this module imports neither click nor
torch. :func:`check_kinds` runs the checks the kinds imply (one-line errors naming the flag), so a
settings object's ``__post_init__`` does not repeat them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import MISSING, dataclass
from typing import Any

from kvbridge.errors import ConfigError, whole_number


#: ``Opt.cli_default`` when the command line shows and parses the field's own default
SAME = "<the field's default>"


@dataclass(frozen=True)
class Opt:
    """How a settings field appears on the command line.

    ``flags``: the option's spellings (default ``--field-name``); ``kind``: its type (see the module
    docstring; None: text); ``show_default``: print the default in ``--help``; ``flag``: an
    on/off flag (``invert``: the flag sets the field to False, e.g. ``--no-attention``);
    ``multiple``: repeatable (a tuple); ``cli_default``: the default the command line shows and
    parses when it differs from the field's, with ``default_if_not_given`` the field keeps its own
    default unless the option is given; ``nested``: the field is a settings dataclass whose fields
    are options too."""

    help: str = ""
    flags: tuple = ()
    kind: Any = None
    show_default: bool = False
    metavar: str | None = None
    multiple: bool = False
    flag: bool = False
    invert: bool = False
    required: bool = False
    cli_default: Any = SAME
    default_if_not_given: bool = False
    nested: bool = False


def option(default: Any = MISSING, help: str = "", **how) -> Any:  # noqa: A002 - click's word
    """A dataclass field with ``default`` and its command-line option (:class:`Opt` keywords)."""
    meta = {"option": Opt(help=help, **how)}
    if callable(default) and isinstance(default, type):  # a nested settings dataclass
        return dataclasses.field(default_factory=default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def option_fields(cls) -> list[tuple[dataclasses.Field, Opt]]:
    """The fields of ``cls`` that declare an option, in declaration order, with their :class:`Opt`."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(cls) if "option" in f.metadata]


def flag_of(f: dataclasses.Field, opt: Opt) -> str:
    """The option's long spelling (the one error messages name)."""
    longs = [s for s in opt.flags if s.startswith("--")]
    return longs[0] if longs else "--" + f.name.replace("_", "-")


def check_kinds(obj, error: type | None = None, kinds=("count", "seed", "choice", "real", "share")) -> None:
    """Refuse a field whose value its kind does not allow (``error``, default
    :class:`~kvbridge.errors.ConfigError`, one line naming the flag): a count (``("count", min)``,
    ``"seed"``) a whole number at or above its minimum, a choice (``("choice", names)``) one of its
    names, a real (``("real", min, max, {"min_open": ...})``, ``"share"``: in (0, 1]) a finite number
    in its range; None passes where the field's default is None. The checks an option's type does on
    the command line, for a settings object made in Python (``kinds``: which of them)."""
    error = error or ConfigError
    for f, opt in option_fields(type(obj)):
        name, *args = opt.kind if isinstance(opt.kind, tuple) else (opt.kind,)
        value, flag = getattr(obj, f.name), flag_of(f, opt)
        if name not in kinds or (value is None and f.default is None):
            continue
        if name in ("count", "seed"):
            whole_number(value, flag, 0 if name == "seed" else (args[0] if args else 1), error)
        elif name == "choice" and value not in args[0]:
            names = tuple(args[0])
            raise error(f"{flag} must be one of {', '.join(names)}, got {value!r}", f"pass e.g. {flag} {names[0]}")
        elif name in ("real", "share"):
            _check_real(value, flag, *((0, 1, {"min_open": True}) if name == "share" else args), error=error)


def _check_real(value, flag: str, *bounds, error: type) -> None:
    """``value`` a finite real within ``bounds`` (``[min[, max]][, {"min_open": ..., "max_open": ...}]``)."""
    opts = bounds[-1] if bounds and isinstance(bounds[-1], dict) else {}
    lo, hi = ([b for b in bounds if not isinstance(b, dict)] + [None, None])[:2]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    tests = [(lo, ">" if opts.get("min_open") else ">="), (hi, "<" if opts.get("max_open") else "<=")]
    tests = [(bound, op) for bound, op in tests if bound is not None]
    compare = {">": float.__gt__, ">=": float.__ge__, "<": float.__lt__, "<=": float.__le__}
    ok = ok and all(compare[op](float(value), float(b)) for b, op in tests)
    if not ok:
        where = " and ".join(["a finite number", *(f"{op} {b:g}" for b, op in tests)]).replace(" and ", " ", 1)
        raise error(f"{flag} must be {where}, got {value!r}", f"pass {flag} as {where}")


def check_counts(obj, error: type | None = None) -> None:
    """:func:`check_kinds` of the counts only (``("count", min)``, ``"seed"``)."""
    check_kinds(obj, error, ("count", "seed"))


# -- options several commands share: declared once, each command gives its own help --------------------
def out_option(help: str, default: Any = None, **how) -> Any:  # noqa: A002
    """``--out``: a folder to write (a path; ``required=True`` where the command has no default)."""
    return option(default, help, kind=("path", {}), **how)


def seed_option(help: str, default: int = 0, **how) -> Any:  # noqa: A002
    """``--seed``: a whole number a generator takes (:data:`kvbridge.cli.numbers.SEED`)."""
    return option(default, help, kind="seed", show_default=True, **how)


def overwrite_option(help: str = "Replace an existing --out folder.") -> Any:  # noqa: A002
    """``--overwrite``: replace an existing output folder."""
    return option(False, help, flag=True)


def report_option(help: str) -> Any:  # noqa: A002
    """``--report``: a report folder to write (``report_dir``)."""
    return option(None, help, flags=("--report",), kind=("path", {"file_okay": False}))


def partial_option(what: str) -> Any:
    """``--partial``: the JSONL of finished ``what`` (``partial_path``; default: :func:`partial_file`)."""
    return option(
        None,
        f"JSONL of finished {what}, rewritten atomically after each (default with --report: "
        "REPORT.partial.jsonl, removed once the report is written).",
        flags=("--partial",),
        kind=("path", {"dir_okay": False}),
    )


def partial_file(settings) -> str | None:
    """Where a run's finished work goes: ``settings.partial_path``, or ``REPORT.partial.jsonl`` beside
    ``settings.report_dir``."""
    if settings.partial_path is None and settings.report_dir:
        return str(settings.report_dir).rstrip("/\\") + ".partial.jsonl"
    return settings.partial_path


def mismatch_option() -> Any:
    """``--accept-fingerprint-mismatch``: use a mapping made for other models (warns)."""
    return option(
        False, "Use a mapping whose fingerprints do not match the models (warns instead of refusing).", flag=True
    )


def bootstrap_option(default: int = 1000) -> Any:
    """``--bootstrap``: paired bootstrap resamples (0: no intervals)."""
    return option(default, "Paired bootstrap resamples.", kind=("count", 0), show_default=True)


def nonempty(value, flag: str, fix: str, error: type | None = None) -> None:
    """Refuse a required text option that is not a non-empty str (one line naming ``flag``)."""
    if not isinstance(value, str) or not value.strip():
        raise (error or ConfigError)(f"{flag} is empty", fix)


#: the fix of an empty ``--mapping``
MAPPING_FIX = "pass a mapping folder from `kvbridge fit`, or identity"
