"""What ``kvbridge fit`` (and :func:`kvbridge.fit.run.fit_pair`) is asked to do.

A frozen value with the CLI's defaults, one field per ``kvbridge fit`` option; bad values are
refused here, as one-line :class:`~kvbridge.errors.ConfigError` naming the option and the fix, so
the Python API gets the same checks as the command line. No torch, no models: a value module low
in the layering. Checks that need the fitter plugin or the files (fitter options, a replaceable
``out``, the corpus) are :func:`kvbridge.fit.run.prepare`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from kvbridge.errors import ConfigError, path_value, whole_number


def parse_top_k(value) -> list | int | None:
    """``4`` -> 4; ``"1,2,4,all"`` / ``[1, 2, "all"]`` -> ``[1, 2, 4, "all"]`` (each >= 1, or ``all``);
    a one-line error naming ``--top-k`` otherwise."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    parts = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for part in parts:
        text = str(part).strip().lower()
        if text == "all":
            out.append("all")
        elif text.isdigit() and int(text) >= 1 and len(text) < 10:
            out.append(int(text))
        else:
            raise ConfigError(
                f"--top-k value {str(part).strip()!r} is not a whole number >= 1 or 'all'",
                "use e.g. --top-k 4 or --top-k 1,2,4,8,all",
            )
    if not out:
        raise ConfigError("--top-k is empty", "use e.g. --top-k 4 or --top-k 1,2,4,8,all")
    if len(out) == 1 and out[0] != "all" and isinstance(value, str):
        return out[0]
    return list(dict.fromkeys(out))


def _top_k(value):
    """None, one k (an int or ``"all"``), or a tuple of 2+ (a sweep from one pass)."""
    if isinstance(value, bool):
        raise ConfigError(f"--top-k must be a whole number >= 1 or 'all', got {value!r}", "use e.g. --top-k 4")
    parsed = parse_top_k(value)
    if isinstance(parsed, int):
        whole_number(parsed, "--top-k", 1)
    if isinstance(parsed, list):
        return parsed[0] if len(parsed) == 1 else tuple(parsed)
    return parsed


def _share(value, flag: str, *, open_low: bool = True) -> None:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > 0 if open_low else value >= 0)
        and value < 1
    )
    if not ok:
        raise ConfigError(
            f"{flag} must be a share {'in (0, 1)' if open_low else 'in [0, 1)'}, got {value!r}", f"use e.g. {flag} 0.1"
        )


def _options(value) -> tuple:
    """``-o key=value`` strings: a mapping becomes ``("key=value", ...)``."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        return tuple(f"{k}={v}" for k, v in value.items())
    if isinstance(value, str):
        return (value,)
    try:
        return tuple(str(v) for v in value)
    except TypeError:
        raise ConfigError(
            f"-o must be KEY=VALUE strings, got {type(value).__name__}",
            "pass e.g. fitter_options=('top_k=2',) or a dict",
        ) from None


@dataclass(frozen=True)
class FitSettings:
    """Every ``kvbridge fit`` option (see ``kvbridge fit --help``). ``corpus``: calibration text (file,
    JSONL, folder; ``corpus_heldout`` of a folder's files, or the last ``corpus_heldout`` of a file's
    text, is held out for eval and not read; 0: none); ``out``: the mapping
    folder (None: return the mapping unwritten; the command requires it); ``fitter`` and its
    ``fitter_options`` (``-o key=value``; ``top_k``, ``alpha``, ``estimator``, ``estimator_options``,
    ``max_samples`` and ``memory_gib`` are shortcuts for them, applied only when given); ``top_k``
    may be a tuple (a k sweep). ``seq_len``, ``tokens``, ``stride``, ``skip``, ``heldout``, ``seed``,
    ``batch_size``: the calibration. ``dtype``: the models are loaded (and planned) in it.
    ``keep_stats`` / ``from_stats``: write / solve from kept statistics; ``plan``: the resource plan
    only (``device_flops``, ``plan_device``: its time estimate). ``quiet``: no progress bars."""

    corpus: str | None = None
    corpus_heldout: float = 0.1
    out: str | None = None
    fitter: str = "ridge"
    fitter_options: tuple = ()
    top_k: Any = None
    seq_len: int = 512
    tokens: int | None = None
    tokens_offset: int = 0
    stride: int = 4
    skip: int = 0
    alpha: Any = None
    heldout: float = 0.1
    seed: int = 0
    batch_size: int = 4
    estimator: str | None = None
    estimator_options: str | None = None
    max_samples: int | None = None
    memory_gib: float | None = None
    dtype: str = "float32"
    keep_stats: str | None = None
    from_stats: str | None = None
    resume: bool = False
    overwrite: bool = False
    quiet: bool = False
    plan: bool = False
    device_flops: float | None = None
    plan_device: str | None = None

    def __post_init__(self) -> None:
        from kvbridge.check import validate
        from kvbridge.dtypes import LOAD_DTYPES

        for name, flag in (
            ("corpus", "--corpus"),
            ("out", "--out"),
            ("keep_stats", "--keep-stats"),
            ("from_stats", "--from-stats"),
        ):
            object.__setattr__(self, name, path_value(getattr(self, name), flag))
        object.__setattr__(self, "fitter_options", _options(self.fitter_options))
        object.__setattr__(self, "top_k", _top_k(self.top_k))
        if not isinstance(self.fitter, str) or not self.fitter.strip():
            raise ConfigError("--fitter is empty", "name a fitter (`kvbridge plugins` lists them), e.g. ridge")
        _share(self.corpus_heldout, "--corpus-heldout", open_low=False)
        _share(self.heldout, "--heldout", open_low=False)
        validate.seq_len(self.seq_len)
        validate.tokens(self.tokens)
        whole_number(self.tokens_offset, "--tokens-offset", 0)
        validate.stride(self.stride, self.seq_len, skip=validate.non_negative_int(self.skip, "--skip"))
        if self.alpha is not None:
            validate.alpha(self.alpha)
        validate.memory_gib(self.memory_gib)
        whole_number(self.seed, "--seed", 0)
        whole_number(self.batch_size, "--batch-size", 1)
        if self.max_samples is not None:
            whole_number(self.max_samples, "--max-samples", 1)
        if self.device_flops is not None:
            validate.finite_number(
                self.device_flops, "--device-flops", positive=True, fix="pass e.g. --device-flops 1e14"
            )
        if self.dtype not in LOAD_DTYPES:
            raise ConfigError(
                f"--dtype {self.dtype!r} is not a dtype models load in", f"use one of: {', '.join(LOAD_DTYPES)}"
            )
        for name, flag in (
            ("estimator", "--estimator"),
            ("estimator_options", "--estimator-options"),
            ("plan_device", "--calibrate"),
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"{flag} is empty", f"give a value for {flag}, or leave it out")

    @property
    def sweep(self) -> bool:
        """Several top-k values: one mapping per k from one pass (``out/k1``, ``out/k2``, ...)."""
        return isinstance(self.top_k, tuple)


__all__ = ["FitSettings", "parse_top_k"]
