"""What ``kvbridge transfer`` (and :func:`kvbridge.transfer_run.transfer_generate`) is asked to do.

A frozen value with the CLI's defaults; bad values are refused here, as one-line
:class:`~kvbridge.errors.ConfigError` naming the option and the fix, so the Python API gets the
same checks as the command line. No torch, no models: a value module low in the layering.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbridge.errors import ConfigError
from kvbridge.settings_fields import MAPPING_FIX, check_kinds, mismatch_option, nonempty, option, overwrite_option

#: ``mapping=IDENTITY``: the built-in exact mapping (SOURCE and TARGET one model)
IDENTITY = "identity"


@dataclass(frozen=True)
class TransferSettings:
    """Each field is an option of ``kvbridge transfer`` (``--mapping`` ...); its help says what it asks for."""

    mapping: str = option(
        help="Mapping folder from `kvbridge fit`, or `identity` (SOURCE and TARGET the same model: the exact baseline).",
        kind=("path", {}),
        required=True,
    )
    prompt: str = option(help="Prompt text (or @FILE); SOURCE prefills it, TARGET continues.", required=True)
    max_new_tokens: int = option(32, "Tokens TARGET generates (greedy).", kind=("count", 1), show_default=True)
    compare: bool = option(
        False,
        "Also run TARGET natively: token agreement, next-token KL and timings.",
        flags=("--compare/--no-compare",),
        flag=True,
        show_default=True,
    )
    engine: str | None = option(
        None,
        "Continue in an inference engine instead of transformers (llamacpp: TARGET's .gguf runs in "
        "llama.cpp from the transferred cache; `kvbridge plugins` lists engines).",
    )
    accept_fingerprint_mismatch: bool = mismatch_option()
    save_state: str | None = option(
        None,
        "Also write the transferred cache (the prompt minus its last token) as a pack folder for TARGET, "
        "marked approximate with its source and mapping; `kvbridge engine export` hands it to an engine.",
        kind=("path", {}),
    )
    overwrite: bool = overwrite_option("Replace an existing --save-state pack.")

    def __post_init__(self) -> None:
        nonempty(self.mapping, "--mapping", MAPPING_FIX)
        if not isinstance(self.prompt, str):
            raise ConfigError(f"--prompt must be text, got {type(self.prompt).__name__}", "pass the prompt as a str")
        check_kinds(self)  # --max-new-tokens
        if self.engine is not None:
            nonempty(self.engine, "--engine", "name an engine (`kvbridge plugins` lists them), or leave it out")
        if self.save_state is not None:
            nonempty(self.save_state, "--save-state", "pass the pack folder to write, or leave it out")
