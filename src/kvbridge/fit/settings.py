"""What ``kvbridge fit`` (and :func:`kvbridge.fit.fit`, :func:`kvbridge.fit.run.fit_run`) is asked to do.

A frozen value with the CLI's defaults, one field per ``kvbridge fit`` option; bad values are
refused here, as one-line :class:`~kvbridge.errors.ConfigError` naming the option and the fix, so
the Python API gets the same checks as the command line. No torch, no models: a value module low
in the layering. Checks that need the fitter plugin or the files (fitter options, a replaceable
``out``, the corpus) are :func:`kvbridge.fit.run.prepare`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from kvbridge.dtypes import LOAD_DTYPES
from kvbridge.errors import ConfigError, path_value, whole_number
from kvbridge.settings_fields import check_counts, flag_of, nonempty, option, option_fields


#: source layers per target layer that ``fit`` uses by default (``check`` assumes the same)
DEFAULT_TOP_K = 4
#: ``fit`` warns when the training observations per target head are fewer than this many times
#: the features of one least-squares problem (a common rule of thumb for a stable regression:
#: at least ten observations per parameter; below it held-out R² drops and varies with the seed)
MIN_OBS_PER_FEATURE = 10


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


def _share(value, flag: str) -> None:
    """``value`` a share in ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and 0 <= value < 1):
        raise ConfigError(f"{flag} must be a share in [0, 1), got {value!r}", f"use e.g. {flag} 0.1")


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
    """Every ``kvbridge fit`` option, one field each (its help is the option's, ``kvbridge fit --help``).
    ``out`` None: the mapping is returned unwritten (the command requires it). ``top_k``, ``alpha``,
    ``estimator``, ``estimator_options``, ``max_samples`` and ``memory_gib`` are shortcuts for
    ``fitter_options`` (``-o key=value``), applied only when given; ``top_k`` may be a tuple (a k sweep).
    ``dtype``: the models are loaded (and planned) in it."""

    corpus: str | None = option(
        None,
        "Text file, JSONL with a 'text' field, or folder of .py/.txt files (required unless --plan); a folder is split by file, a file by position (--corpus-heldout), and only the calibration part is read.",
        kind=("path", {"exists": False}),
    )
    corpus_heldout: float = option(
        0.1,
        "Share of the corpus held out for eval and not read by the fit (recorded in the mapping; `eval` "
        "then reads only it): a folder's files chosen by a hash of each file's relative path, or a file's "
        "last share of characters (from a line start: the tail `eval --heldout-fraction` reads). 0: none.",
        kind=("real", 0, 1, {"max_open": True}),
        show_default=True,
    )
    out: str | None = option(
        None, "Mapping folder to write (mapping.safetensors + manifest.json; required unless --plan).", kind="path"
    )
    fitter: str = option("ridge", "Fitter plugin (ridge, ridge-headwise, sklearn, ...).", show_default=True)
    fitter_options: tuple = option(
        (),
        "A fitter option (repeatable), checked against the fitter's options dataclass: unknown keys are "
        "refused, values coerced to their types, e.g. -o top_k=2 -o alpha=auto (docs/plugins.md lists "
        "each fitter's options).",
        flags=("-o", "--option"),
        multiple=True,
        metavar="KEY=VALUE",
    )
    top_k: Any = option(
        None,
        "Source layers per target layer (ridge, sklearn; default 4, "
        "or the source's layers when it has fewer) = -o top_k=N. A list (--top-k 1,2,4,8,all; ridge) fits every "
        "k from one pass of forwards and writes one mapping per k into --out/k1, --out/k2, ... --out/kall.",
        kind="top_k",
    )
    seq_len: int = option(512, "Tokens per calibration sequence.", kind=("count", 2), show_default=True)
    tokens: int | None = option(None, "Calibration tokens to read (default: the whole corpus).", kind=("count", 1))
    tokens_offset: int = option(
        0,
        "Skip this many calibration tokens first: runs with offsets 0, T, 2T, ... and --tokens T read disjoint "
        "chunks; --from-stats A,B,... merges their kept statistics.",
        kind=("count", 0),
        show_default=True,
    )
    stride: int = option(4, "Keep every stride-th position of each sequence.", kind=("count", 1), show_default=True)
    skip: int = option(
        0, "Drop the first N positions of each sequence (attention sinks).", kind=("count", 0), show_default=True
    )
    alpha: Any = option(None, "Ridge strength, or 'auto' (chosen on the held-out split); default 0.01 = -o alpha=X.")
    heldout: float = option(
        0.1, "Share of sequences held out for R² (and --alpha auto).", kind=("real",), show_default=True
    )
    seed: int = option(0, "Seed of the position sampling and the held-out split.", kind="seed", show_default=True)
    batch_size: int = option(4, "Sequences per forward pass.", kind="int", show_default=True)
    estimator: str | None = option(
        None, "sklearn fitter: 'module:Class' (e.g. sklearn.linear_model:RidgeCV) = -o estimator=X."
    )
    estimator_options: str | None = option(None, "sklearn fitter: JSON options of the estimator.")
    max_samples: int | None = option(
        None, "sklearn fitter: cap on materialised observations (default 100000).", kind=("count", 1)
    )
    memory_gib: float | None = option(
        None,
        "Statistics memory budget in GiB (default 8 or $KVBRIDGE_FIT_MEMORY).",
        flags=("--memory",),
        kind=("real", 0, None, {"min_open": True}),
    )
    dtype: str = option("float32", "Dtype to load the models in.", kind=("choice", LOAD_DTYPES), show_default=True)
    keep_stats: str | None = option(
        None,
        "Also write the fit's statistics "
        "(safetensors + manifest.json with both models' fingerprints) to this folder, for --from-stats (ridge).",
        kind="path",
    )
    from_stats: str | None = option(
        None,
        "Solve from statistics kept by "
        "--keep-stats instead of running the models (no weights loaded): other --top-k (up to the kept one), "
        "--alpha; SOURCE and TARGET are checked against the kept specs. Several folders (DIR1,DIR2,...: runs on "
        "disjoint chunks, --tokens-offset) are merged into one fit.",
        kind="path",
    )
    resume: bool = option(
        False,
        "Keep resumable statistics in .<out>.fitstate/ beside --out (checksummed; removed on success) "
        "and continue an interrupted fit from them.",
        flag=True,
    )
    overwrite: bool = option(False, "Replace an existing --out folder.", flag=True)
    quiet: bool = option(False, "No progress bar.", flag=True)
    plan: bool = option(
        False,
        "Print the resource plan (statistics memory, blocking, artifact "
        "size, FLOPs, time at --device-flops) from the configs alone and exit: no weights loaded.",
        flag=True,
    )
    device_flops: float | None = option(
        None,
        "--plan: the device's FLOP/s for the time estimate, e.g. 1e14.",
        kind=("real", 0, None, {"min_open": True}),
    )
    plan_device: str | None = option(
        None,
        "--plan: measure the rates of each part "
        "of a fit here (one random-weight decoder layer per model, float32 Gram and float64 GEMM and solve, memory, sha256; a few "
        "seconds, imports torch) on DEVICE (cpu, cuda) and estimate the time from them.",
        flags=("--calibrate",),
        metavar="DEVICE",
    )

    def __post_init__(self) -> None:
        from kvbridge.check import validate

        flags = {f.name: flag_of(f, opt) for f, opt in option_fields(type(self))}
        for name in ("corpus", "out", "keep_stats", "from_stats"):
            object.__setattr__(self, name, path_value(getattr(self, name), flags[name]))
        object.__setattr__(self, "fitter_options", _options(self.fitter_options))
        object.__setattr__(self, "top_k", _top_k(self.top_k))
        if isinstance(self.estimator_options, Mapping):  # given in Python as a dict: its JSON text
            object.__setattr__(self, "estimator_options", json.dumps(dict(self.estimator_options)))
        nonempty(self.fitter, "--fitter", "name a fitter (`kvbridge plugins` lists them), e.g. ridge")
        _share(self.corpus_heldout, "--corpus-heldout")
        _share(self.heldout, "--heldout")
        validate.seq_len(self.seq_len)
        validate.tokens(self.tokens)
        validate.stride(self.stride, self.seq_len, skip=validate.non_negative_int(self.skip, "--skip"))
        check_counts(self)  # the counts of the fields' kinds: --tokens-offset, --seed, --max-samples, ...
        if self.alpha is not None:
            validate.alpha(self.alpha)
        validate.memory_gib(self.memory_gib)
        whole_number(self.batch_size, "--batch-size", 1)
        if self.device_flops is not None:
            validate.finite_number(
                self.device_flops, "--device-flops", positive=True, fix="pass e.g. --device-flops 1e14"
            )
        if self.dtype not in LOAD_DTYPES:
            raise ConfigError(
                f"--dtype {self.dtype!r} is not a dtype models load in", f"use one of: {', '.join(LOAD_DTYPES)}"
            )
        for name in ("estimator", "estimator_options", "plan_device"):  # plan_device: --calibrate
            if getattr(self, name) is not None:
                nonempty(getattr(self, name), flags[name], f"give a value for {flags[name]}, or leave it out")

    @property
    def sweep(self) -> bool:
        """Several top-k values: one mapping per k from one pass (``out/k1``, ``out/k2``, ...)."""
        return isinstance(self.top_k, tuple)
