"""What ``kvbridge eval`` (and :func:`kvbridge.evaluate.run.evaluate_pair`) is asked to do.

Frozen values with the CLI's defaults; bad values are refused here, as one-line errors naming the
option and the fix, so the Python API gets the command line's checks. Torch-free except the
condition names, read from :mod:`kvbridge.evaluate.conditions` when ``conditions`` is not ``all``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbridge.errors import ConfigError, whole_number

#: ``--recompute-token-rules``, the rows :func:`kvbridge.recompute.tokens.blend` recomputes: the CacheBlend
#: deviation rule, random rows (control), the chunk's first rows (where a chunk prepared alone keeps its
#: attention sink; EPIC-style, a second control), the stretch's last rows (the tail a continuation reads
#: most: the simplest rule a user would try)
TOKEN_RULES = ("deviation", "random", "first", "last")
#: the held-out share when ``heldout_fraction`` is None and the mapping records none for the corpus
HELDOUT_FRACTION = 0.1


@dataclass(frozen=True)
class RecomputeSettings:
    """``eval --recompute-*``: recompute target layers (``layers``: ``3,7-9 | all | auto:15%``, ';' between
    points) and/or tokens (``tokens``: ``R[,R...]``), or a ``sweep`` over the dial (see docs/recompute.md)."""

    layers: str | None = None
    tokens: str | None = None
    token_rules: str = "deviation"  # which rows --recompute-tokens picks: deviation (CacheBlend) | last | ...
    sweep: str | None = None
    mode: str = "target"
    select: str = "greedy"
    group: int = 1
    calibration_samples: int = 16

    def __post_init__(self) -> None:
        for flag, value, allowed in (
            ("--recompute-sweep", self.sweep, (None, "layers", "tokens", "both")),
            ("--recompute-mode", self.mode, ("target", "source")),
            ("--recompute-select", self.select, ("greedy", "profile", "prefix")),
        ):
            if value not in allowed:
                raise ConfigError(
                    f"{flag} {value!r} is not one of {', '.join(str(a) for a in allowed if a)}",
                    f"pass one of them to {flag}",
                )
        bad = [r for r in self.rules if r not in TOKEN_RULES]
        if bad or not self.rules:
            raise ConfigError(
                f"--recompute-token-rules {self.token_rules!r}: unknown rule {bad[0] if bad else ''!r}",
                f"pass one or more of {', '.join(TOKEN_RULES)}, comma-separated",
            )
        whole_number(self.group, "--recompute-group", 1)
        whole_number(self.calibration_samples, "--calibration-samples", 1)

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(r.strip() for r in str(self.token_rules).split(",") if r.strip())

    @property
    def active(self) -> bool:
        """Any ``--recompute-*`` point or sweep asked: the run is the recompute curve."""
        return bool(self.layers or self.tokens or self.sweep)


@dataclass(frozen=True)
class EvalSettings:
    """One ``kvbridge eval`` run; fields are the command's options (``attention`` = not ``--no-attention``,
    ``heldout_fraction=None`` = the share the mapping records for the corpus (a folder's split, a file's
    held-out tail), else :data:`HELDOUT_FRACTION`)."""

    mapping: str
    corpus: str
    samples: int = 64
    prefix_len: int = 64
    continuation_len: int = 8
    greedy_tokens: int = 16
    heldout_fraction: float | None = None
    conditions: str = "all"
    bootstrap: int = 1000
    seed: int = 0
    batch_size: int = 16
    top_k: int = 5
    top_p: float = 0.9
    attention: bool = True
    gates: tuple = ()
    report_dir: str | None = None
    accept_fingerprint_mismatch: bool = False
    allow_overlap: bool = False
    partial_path: str | None = None
    recompute: RecomputeSettings = field(default_factory=RecomputeSettings)
    frontier: str | None = (
        None  # R[,R...]: the compute frontier (kvbridge.recompute.frontier) instead of the conditions
    )
    sink: int = 4  # sink tokens kept by the frontier's truncated@R and tail@R

    def __post_init__(self) -> None:
        from kvbridge.check.validate import finite_number
        from kvbridge.evaluate.gates import parse_gate

        if not isinstance(self.mapping, str) or not self.mapping.strip():
            raise ConfigError("--mapping is empty", "pass a mapping folder from `kvbridge fit`, or identity")
        if self.corpus is None or not str(self.corpus).strip():
            raise ConfigError("--corpus is empty", "pass a text file, a JSONL file or a folder")
        object.__setattr__(self, "gates", tuple(self.gates))
        for text in self.gates:  # a typo in a gate fails before anything is loaded
            parse_gate(text)
        whole_number(self.samples, "--samples", 2)
        for flag, value in (
            ("--prefix-len", self.prefix_len),
            ("--continuation-len", self.continuation_len),
            ("--greedy-tokens", self.greedy_tokens),
            ("--batch-size", self.batch_size),
            ("--top-k", self.top_k),
        ):
            whole_number(value, flag, 1)
        whole_number(self.bootstrap, "--bootstrap", 0)
        whole_number(self.seed, "--seed", 0)
        finite_number(self.top_p, "--top-p", positive=True)  # click's FloatRange lets NaN through
        if self.top_p > 1:
            raise ConfigError(f"--top-p must be <= 1, got {self.top_p!r}", "pass a share in (0, 1]")
        if self.heldout_fraction is not None:
            finite_number(self.heldout_fraction, "--heldout-fraction", positive=True)
            if self.heldout_fraction > 1:
                raise ConfigError(
                    f"--heldout-fraction must be <= 1, got {self.heldout_fraction!r}", "pass a share in (0, 1]"
                )
        if not isinstance(self.recompute, RecomputeSettings):
            raise ConfigError("recompute must be a RecomputeSettings", "pass RecomputeSettings(...) or leave it out")
        whole_number(self.sink, "--sink", 0)
        if self.frontier is not None:
            parse_frontier(self.frontier)  # a typo fails before anything is loaded
            for flag, given in (
                ("--recompute-*", self.recompute.active),
                ("--conditions", str(self.conditions).strip() not in ("", "all")),
                ("--gate", bool(self.gates)),
            ):
                if given:
                    raise ConfigError(
                        f"--frontier runs its own conditions; {flag} cannot be combined with it",
                        f"drop {flag} or run it without --frontier",
                    )
        if self.report_dir:  # refuse a --report folder that is not an earlier report before the (long) run
            from kvbridge.artifacts import check_replaceable
            from kvbridge.evaluate.report import REPORT_KIND

            check_replaceable(self.report_dir, REPORT_KIND, overwrite=True, flag="")
        self.condition_names()  # unknown names refused now

    def condition_names(self) -> tuple[str, ...]:
        """``conditions`` as names (``all``: every built-in condition)."""
        from kvbridge.evaluate.conditions import CONDITIONS, EvalError

        text = str(self.conditions)
        conds = CONDITIONS if text.strip() in ("", "all") else tuple(c.strip() for c in text.split(","))
        bad = [c for c in conds if c not in CONDITIONS]
        if bad:
            raise EvalError(f"unknown condition {bad[0]!r}", f"use some of {', '.join(CONDITIONS)}")
        return tuple(conds)

    @property
    def frontier_ratios(self) -> tuple[float, ...]:
        """``frontier`` as sorted shares of the prefix (``"0.1,25%"`` -> ``(0.1, 0.25)``); () when not asked."""
        return parse_frontier(self.frontier) if self.frontier is not None else ()

    @property
    def sample_len(self) -> int:
        return self.prefix_len + self.continuation_len + 1


def parse_frontier(text) -> tuple[float, ...]:
    """``--frontier R[,R...]``: shares of the prefix in [0, 1] (``0.25`` or ``25%``), sorted, no repeats."""
    import math

    fix = "pass shares of the prefix between 0 and 1, comma-separated, e.g. --frontier 0.1,0.25,0.5"
    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise ConfigError(f"--frontier {text!r} names no share", fix)
    out = []
    for item in items:
        try:
            value = float(item[:-1]) / 100 if item.endswith("%") else float(item)
        except ValueError:
            raise ConfigError(f"--frontier {text!r}: {item!r} is not a number", fix) from None
        if not math.isfinite(value) or not 0 <= value <= 1:
            raise ConfigError(f"--frontier {text!r}: {item!r} is outside 0..1", fix)
        if value in out:
            raise ConfigError(f"--frontier {text!r}: {item!r} is repeated", "name each share once")
        out.append(value)
    return tuple(sorted(out))


__all__ = ["EvalSettings", "HELDOUT_FRACTION", "RecomputeSettings", "parse_frontier"]
