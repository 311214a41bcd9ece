"""What ``kvbridge demo`` is asked to do: one field per option (the command's options are generated
from it); the zoo section reads it whole."""

from __future__ import annotations

from dataclasses import dataclass

from kvbridge.demo import DEFAULT_SECTIONS
from kvbridge.errors import names_value
from kvbridge.settings_fields import option

#: the zoo targets paired with ``base``
PAIRS = ("tuned", "wide", "odd", "stranger")


@dataclass(frozen=True)
class DemoSettings:
    """``pairs``: zoo names, or the comma list the command line gives."""

    sections: str = option(
        ",".join(DEFAULT_SECTIONS),
        "Sections to run, in order: identity, zoo, real (the default, within 3 minutes on 2 cores); "
        "adapter (opt-in: the real SmolLM2 LoRA pair, fit and eval), pair (opt-in: the Qwen2.5-Coder pair).",
        show_default=True,
    )
    identity_only: bool = option(
        False,
        "Only section 1: the identity-transfer exactness table of every built-in family.",
        flags=("--identity",),
        flag=True,
    )
    skip_identity: bool = option(False, "Leave out section 1.", flag=True)
    skip_real: bool = option(False, "Leave out section 3 (the real model).", flag=True)
    families: str = option("", "Comma-separated family adapters for section 1 (default: all built-in).")
    new_tokens: int = option(
        8, "Greedy tokens generated per model (sections 1, 3).", kind=("count", 1), show_default=True
    )
    pairs: tuple = option(PAIRS, "Zoo targets paired with base.", cli_default=",".join(PAIRS), show_default=True)
    corpus: str | None = option(
        None,
        "Corpus text (default: ../shared/corpora/tinyshakespeare.txt if present, "
        "else text sampled from the zoo models).",
    )
    report_dir: str | None = option(
        "demo-report", "Report folder ('' for none).", flags=("--report",), show_default=True
    )
    tokens: int = option(32768, "Calibration tokens per fit.", kind=("count", 1), show_default=True)
    top_k: int = option(4, "Ridge: source layers per target layer.", kind=("count", 1), show_default=True)
    stride: int = option(4, "Calibration position stride.", kind=("count", 1), show_default=True)
    samples: int = option(64, "Held-out evaluation samples per pair.", kind=("count", 2), show_default=True)
    prefix_len: int = option(64, kind=("count", 1), show_default=True)
    continuation_len: int = option(8, kind=("count", 1), show_default=True)
    greedy_tokens: int = option(16, kind=("count", 1), show_default=True)
    bootstrap: int = option(1000, kind=("count", 0), show_default=True)
    seed: int = option(0, kind="seed", show_default=True)
    identity_too: bool = option(
        True,
        "Section 2: skip the unfitted identity transfer of same-geometry pairs.",
        flags=("--no-identity-rows",),
        flag=True,
        invert=True,
    )
    real_model: str = option(
        "smollm2",
        "Section 3: the real model reference (fetch smollm2 with `kvbridge models fetch`).",
        show_default=True,
    )
    threads: int | None = option(
        1,
        "torch threads for the default sections (small models: 1 is nearly as fast on idle cores, and "
        "immune to a busy machine, where a second thread waits for the first); adapter and pair use torch's default.",
        kind="threads",
        show_default=True,
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "pairs", names_value(self.pairs, "--pairs"))
