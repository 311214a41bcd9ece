"""What ``kvbridge graft run`` / ``graft eval`` (and :func:`kvbridge.recompute.graft.run_graft`) are asked
to do, and the recompute curve's points (:class:`CurvePlan`).

Frozen values with the CLI's defaults; each field declares its option once (``settings_fields.option``),
so ``kvbridge.cli.options.settings_options`` generates the commands' options from them and the Python API
gets the command line's checks. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbridge.errors import ConfigError, KVBridgeError
from kvbridge.settings_fields import bootstrap_option, check_kinds, option, report_option, seed_option

#: ``graft eval --controls``: the graft's control conditions
GRAFT_CONTROLS = ("random", "first", "no_reposition", "shuffled")


class RecomputeError(KVBridgeError):
    """A recompute request that cannot run as asked."""


def split_list(text) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; a list or tuple is taken as it is."""
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    return [str(x).strip() for x in items if str(x).strip()]


def parse_ratio(text) -> float:
    """A share of tokens: ``15%`` or ``0.15``, in 0..1."""
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise RecomputeError(f"bad token ratio {text!r}", "use a share like 15% or 0.15") from None
    if not 0 <= value <= 1:
        raise RecomputeError(f"token ratio {text!r} is outside 0..100%", "use a share between 0% and 100%")
    return value


@dataclass(frozen=True)
class GraftSettings:
    """One ``kvbridge graft eval`` run (``ratios`` / ``controls``: comma-separated text or a tuple;
    ``attention``: measure the attention-output cosine, Python only)."""

    corpus: str | None = option(
        None, "Text corpus; samples from its last 10%.", kind=("path", {"exists": True}), required=True
    )
    samples: int = option(32, "Held-out samples.", kind=("count", 2), show_default=True)
    context_len: int = option(64, "Context tokens c before the chunk.", kind=("count", 1), show_default=True)
    chunk_len: int = option(64, "Chunk tokens n, prepared alone.", kind=("count", 1), show_default=True)
    continuation_len: int = option(16, "Continuation tokens C scored.", kind=("count", 1), show_default=True)
    ratios: str | tuple = option("5%,15%,30%,100%", "Shares of chunk tokens recomputed.", show_default=True)
    controls: str | tuple = option(
        "random,no_reposition,shuffled", f"Controls: some of {', '.join(GRAFT_CONTROLS)}.", show_default=True
    )
    check_layer: int = option(1, "Layer whose K/V deviation picks the rows.", kind=("count", 0), show_default=True)
    batch_size: int = option(8, "Samples per forward.", kind=("count", 1), show_default=True)
    bootstrap: int = bootstrap_option()
    seed: int = seed_option("Seed of the bootstrap and the random control.")
    report_dir: str | None = report_option("Write graft.md, graft.json and graft.png here.")
    attention: bool = True

    def __post_init__(self) -> None:
        check_kinds(self)
        self.ratio_values  # noqa: B018 - a bad share fails before anything loads
        bad = [c for c in self.control_names if c not in GRAFT_CONTROLS]
        if bad:
            raise RecomputeError(f"unknown control {bad[0]!r}", f"use some of {', '.join(GRAFT_CONTROLS)}")

    @property
    def ratio_values(self) -> tuple[float, ...]:
        """The shares, sorted, without repeats."""
        return tuple(sorted({parse_ratio(x) for x in split_list(self.ratios)}))

    @property
    def control_names(self) -> tuple[str, ...]:
        return tuple(split_list(self.controls))

    @property
    def sample_len(self) -> int:
        return self.context_len + self.chunk_len + self.continuation_len + 1


@dataclass(frozen=True)
class GraftRunSettings:
    """One ``kvbridge graft run``: CONTEXT, a chunk (text or a pack), PROMPT, the share recomputed."""

    context: str = option(help="Context text (or @FILE), prefilled at positions 0..c-1 (with BOS).", required=True)
    chunk: str | None = option(None, "Chunk text (or @FILE), prefilled alone at 0..n-1 (no BOS).")
    pack_dir: str | None = option(
        None,
        "A prefix pack (kvbridge pack save) to graft instead of --chunk.",
        flags=("--pack",),
        kind=("path", {"file_okay": False}),
    )
    prompt: str = option("", "Text (or @FILE) that follows the chunk; the model continues it.", required=True)
    ratio: str = option("0%", "Share of chunk tokens recomputed.", flags=("--recompute-tokens",), show_default=True)
    max_new_tokens: int = option(24, "Greedy tokens compared.", kind=("count", 1), show_default=True)

    def __post_init__(self) -> None:
        if (self.chunk is None) == (self.pack_dir is None):
            raise ConfigError("give exactly one of --chunk and --pack", "pass --chunk TEXT or --pack DIR")
        check_kinds(self)
        object.__setattr__(self, "ratio", parse_ratio(self.ratio))


@dataclass(frozen=True)
class CurvePlan:
    """The points of a recompute curve: ``layer_points`` (``[(name, layers, info)]`` from
    :func:`kvbridge.recompute.curve.layer_points` / ``layer_sweep``), ``token_ratios`` for each of
    ``token_rules``, and the layer whose deviation picks the rows."""

    layer_points: tuple = ()
    token_ratios: tuple = ()
    token_rules: tuple = ("deviation",)
    check_layer: int = 1
