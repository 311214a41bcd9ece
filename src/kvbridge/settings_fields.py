"""Settings fields that declare their command-line option: flag, type, default, help, once.

A stage's frozen settings dataclass (``FitSettings``, ``EvalSettings``, ...) declares each field with
:func:`option`; ``kvbridge.cli.options.settings_options`` builds the click options from these
declarations (in field order) and ``settings_from`` builds the settings from the parsed values, so
the command line and the Python API cannot drift apart. The ``kind`` of a field is click-free (a
tuple: ``("count", 2)``, ``("real", 0, 1, {"max_open": True})``, ``"seed"``, ``"share"``,
``("path", {"exists": True})``, ``("choice", names)``, ...): this module imports neither click nor
torch. :func:`check_counts` runs the whole-number checks the kinds imply (one-line errors naming the
flag), so a settings object's ``__post_init__`` does not repeat them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass
from typing import Any


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


def check_counts(obj) -> None:
    """Refuse a field whose kind is a count (``("count", min)``, ``"seed"``) unless it is a whole
    number at or above its minimum (None passes where the field's default is None)."""
    from kvbridge.errors import whole_number

    for f, opt in option_fields(type(obj)):
        kind = opt.kind if isinstance(opt.kind, tuple) else (opt.kind,)
        if kind[0] not in ("count", "seed"):
            continue
        value = getattr(obj, f.name)
        if value is None and f.default is None:
            continue
        minimum = 0 if kind[0] == "seed" else (kind[1] if len(kind) > 1 else 1)
        whole_number(value, flag_of(f, opt), minimum)


def check_kinds(obj) -> None:
    """:func:`check_counts`, and a field whose kind is a choice (``("choice", names)``) one of its names:
    the checks an option's type does on the command line, for a settings object made in Python."""
    from kvbridge.errors import ConfigError

    check_counts(obj)
    for f, opt in option_fields(type(obj)):
        if isinstance(opt.kind, tuple) and opt.kind[0] == "choice" and getattr(obj, f.name) not in opt.kind[1]:
            flag, names = flag_of(f, opt), tuple(opt.kind[1])
            raise ConfigError(
                f"{flag} must be one of {', '.join(names)}, got {getattr(obj, f.name)!r}",
                f"pass e.g. {flag} {names[0]}",
            )


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


__all__ = [
    "SAME",
    "Opt",
    "option",
    "option_fields",
    "flag_of",
    "check_counts",
    "check_kinds",
    "out_option",
    "seed_option",
    "overwrite_option",
]
