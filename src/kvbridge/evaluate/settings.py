"""What ``kvbridge eval`` (and :func:`kvbridge.evaluate.run.evaluate_pair`) is asked to do.

Frozen values with the CLI's defaults; bad values are refused here, as one-line errors naming the
option and the fix, so the Python API gets the command line's checks. Torch-free: the condition
names and :class:`EvalError` are declared here (:mod:`kvbridge.evaluate.conditions` runs them).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbridge.corpus import DEFAULT_HELDOUT
from kvbridge.errors import ConfigError, KVBridgeError
from kvbridge.settings_fields import (
    MAPPING_FIX,
    bootstrap_option,
    check_kinds,
    mismatch_option,
    nonempty,
    option,
    partial_option,
    report_option,
    partial_file,
    seed_option,
)

#: ``--recompute-token-rules``, the rows :func:`kvbridge.recompute.tokens.blend` recomputes: the CacheBlend
#: deviation rule, random rows (control), the chunk's first rows (where a chunk prepared alone keeps its
#: attention sink; EPIC-style, a second control), the stretch's last rows (the tail a continuation reads
#: most: the simplest rule a user would try)
TOKEN_RULES = ("deviation", "random", "first", "last")
#: every condition, in report order
CONDITIONS = ("native", "transferred", "no_prefix", "zeroed", "shuffled", "random", "no_rope_reapply", "source")
#: conditions whose prefix is a target-geometry cache (attention cosine applies)
CACHE_CONDITIONS = ("native", "transferred", "zeroed", "shuffled", "random", "no_rope_reapply")
#: the controls a transfer must beat
CONTROLS = ("zeroed", "shuffled", "random", "no_rope_reapply")


class EvalError(KVBridgeError):
    """The evaluation cannot run as asked (too few samples, mismatched models)."""


#: the held-out share when ``heldout_fraction`` is None and the mapping records none for the corpus
HELDOUT_FRACTION = DEFAULT_HELDOUT


def frontier_ratios(settings) -> tuple[float, ...]:
    """``settings.frontier`` as sorted shares of the prefix (``"0.1,25%"`` -> ``(0.1, 0.25)``); () when
    not asked (a settings object's ``frontier_ratios``)."""
    return parse_frontier(settings.frontier) if settings.frontier is not None else ()


@dataclass(frozen=True)
class RecomputeSettings:
    """``eval --recompute-*``: recompute target layers (``layers``: ``3,7-9 | all | auto:15%``, ';' between
    points) and/or tokens (``tokens``: ``R[,R...]``), or a ``sweep`` over the dial (see docs/recompute.md)."""

    layers: str | None = option(
        None,
        "Recompute these target layers of the transferred cache: 3,7-9 | all | auto:15% (profiled "
        "on the corpus front); ';' separates several points.",
        flags=("--recompute-layers",),
        metavar="SPEC",
    )
    tokens: str | None = option(
        None,
        "Token-selective recompute of R of the prefix tokens, e.g. 15%.",
        flags=("--recompute-tokens",),
        metavar="R[,R...]",
    )
    token_rules: str = option(  # which rows --recompute-tokens picks: deviation (CacheBlend) | last | ...
        "deviation",
        "Which tokens --recompute-tokens recomputes: deviation (CacheBlend: largest K/V deviation at "
        "an early layer), last (the prefix's tail), first, random; several give one point each.",
        flags=("--recompute-token-rules",),
        show_default=True,
        metavar="RULE[,RULE...]",
    )
    sweep: str | None = option(
        None,
        "Write the quality/cost curve over the dial (table + recompute_curve.png with --report). "
        "With any --recompute-* option the run is the recompute curve (native, transferred, the "
        "points, no_prefix; see docs/recompute.md): --conditions, --gate and greedy are not used.",
        flags=("--recompute-sweep",),
        kind=("choice", ("layers", "tokens", "both")),
    )
    mode: str = option(
        "target",
        "Input of recomputed layers: the target's own forward, or the source's hidden states.",
        flags=("--recompute-mode",),
        kind=("choice", ("target", "source")),
        show_default=True,
    )
    select: str = option(
        "greedy",
        "auto:X layer choice: greedy group search, single-layer profile ranking, "
        "or layers 0..K-1 (cheapest with --recompute-mode target).",
        flags=("--recompute-select",),
        kind=("choice", ("greedy", "profile", "prefix")),
        show_default=True,
    )
    group: int = option(
        1, "Layers per group in the greedy search.", flags=("--recompute-group",), kind=("count", 1), show_default=True
    )
    calibration_samples: int = option(
        16,
        "Corpus-front samples for the layer profiling pass.",
        flags=("--calibration-samples",),
        kind=("count", 1),
        show_default=True,
    )

    def __post_init__(self) -> None:
        check_kinds(self)  # --recompute-sweep, --recompute-mode, --recompute-select, --recompute-group, ...
        bad = [r for r in self.rules if r not in TOKEN_RULES]
        if bad or not self.rules:
            raise ConfigError(
                f"--recompute-token-rules {self.token_rules!r}: unknown rule {bad[0] if bad else ''!r}",
                f"pass one or more of {', '.join(TOKEN_RULES)}, comma-separated",
            )

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
    held-out tail), else :data:`HELDOUT_FRACTION`). Also the settings :func:`kvbridge.evaluate.evaluate`
    runs on samples and a mapping object it is given: ``mapping`` and ``corpus`` (required on the command
    line) may then be None; ``conditions`` may be a tuple of names."""

    mapping: str | None = option(
        None, "Mapping folder written by `kvbridge fit`, or 'identity' (same content geometry).", required=True
    )
    corpus: str | None = option(
        None,
        "Text file, JSONL with 'text' (samples come from its held-out tail), or folder of .py/.txt "
        "(samples come from its held-out files: the mapping's split by path hash).",
        kind=("path", {"exists": True}),
        required=True,
    )
    samples: int = option(64, "Held-out samples.", kind=("count", 2), show_default=True)
    prefix_len: int = option(64, "Cached prefix tokens P.", kind=("count", 1), show_default=True)
    continuation_len: int = option(
        8, "Continuation tokens C scored by teacher forcing from the cache.", kind=("count", 1), show_default=True
    )
    greedy_tokens: int = option(
        16, "Greedy tokens G compared with native's (first divergence step).", kind=("count", 1), show_default=True
    )
    heldout_fraction: float | None = option(
        None,
        "Share of the corpus (its end) that samples come from; fit on the rest (`fit` leaves it out by "
        "default: --corpus-heldout). A folder: the share of files held out. Default: the share the mapping "
        "records for this corpus, else 0.1.",
        kind="share",
        show_default=True,
        cli_default=HELDOUT_FRACTION,
        default_if_not_given=True,
    )
    conditions: str = option("all", "Comma-separated conditions (native is always run).", show_default=True)
    bootstrap: int = bootstrap_option()
    seed: int = seed_option("Seed of the bootstrap and the random control.")
    batch_size: int = option(16, "Samples per forward.", kind=("count", 1), show_default=True)
    top_k: int = option(5, "k of the top-k overlap.", kind=("count", 1), show_default=True)
    top_p: float = option(0.9, "Nucleus of the total-variation distance.", kind="share", show_default=True)
    attention: bool = option(
        True, "Skip the attention-output cosine.", flags=("--no-attention",), flag=True, invert=True
    )
    report_dir: str | None = report_option("Write summary.md, eval.json and PNG plots to this folder.")
    gates: tuple = option(
        (),
        "Enforce a gate (exit 1 when it fails): kl_p95=0.2, attention_cosine_min>=0.9, "
        "COND.METRIC<=X, or 'default'. Repeatable.",
        flags=("--gate",),
        multiple=True,
        metavar="NAME=VALUE",
    )
    accept_fingerprint_mismatch: bool = mismatch_option()
    allow_overlap: bool = option(
        False,
        "Evaluate even when the samples overlap the mapping's calibration text (refused by default).",
        flag=True,
    )
    partial_path: str | None = partial_option("batches")
    recompute: RecomputeSettings = option(RecomputeSettings, nested=True)
    # R[,R...]: the compute frontier (kvbridge.recompute.frontier) instead of the conditions
    frontier: str | None = option(
        None,
        "The compute frontier instead of the conditions: for each share R of the prefix, truncated@R "
        "(the target prefills only --sink first tokens and the last R, at their original positions) beside "
        "tail@R (the same rows computed by the target over the transferred cache), with native, source, "
        "transferred and no_prefix, FLOP shares, paired differences and a verdict (see docs/recompute.md).",
        metavar="R[,R...]",
    )
    sink: int = option(  # sink tokens kept by the frontier's truncated@R and tail@R
        4, "Sink tokens (the prefix's first) kept by --frontier.", kind=("count", 0), show_default=True
    )

    def __post_init__(self) -> None:
        from kvbridge.evaluate.gates import parse_gate

        if self.mapping is not None:
            nonempty(self.mapping, "--mapping", MAPPING_FIX)
        if self.corpus is not None and not str(self.corpus).strip():
            raise ConfigError("--corpus is empty", "pass a text file, a JSONL file or a folder")
        object.__setattr__(self, "gates", tuple(self.gates))
        for text in self.gates:  # a typo in a gate fails before anything is loaded
            parse_gate(text)
        check_kinds(self)  # --samples, --prefix-len, ..., --seed, --sink, --top-p, --heldout-fraction
        object.__setattr__(self, "top_p", float(self.top_p))  # the result records it as a real
        if not isinstance(self.recompute, RecomputeSettings):
            raise ConfigError("recompute must be a RecomputeSettings", "pass RecomputeSettings(...) or leave it out")
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
        """``conditions`` as names (``all``, empty or None: every built-in condition)."""
        text = self.conditions if isinstance(self.conditions, str) else ",".join(self.conditions or ())
        conds = CONDITIONS if text.strip() in ("", "all") else tuple(c.strip() for c in text.split(","))
        bad = [c for c in conds if c not in CONDITIONS]
        if bad:
            raise EvalError(f"unknown condition {bad[0]!r}", f"use some of {', '.join(CONDITIONS)}")
        return tuple(conds)

    @property
    def sample_len(self) -> int:
        return self.prefix_len + self.continuation_len + 1

    partial_file = property(partial_file)
    frontier_ratios = property(frontier_ratios)


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
