"""What each ``kvbridge steer`` subcommand (and its call in :mod:`kvbridge.steer.stages`) is asked to do.

Frozen values whose fields declare the subcommand's options (:mod:`kvbridge.settings_fields`), one per subcommand: :class:`SteerBuildSettings`,
:class:`SteerTransferSettings`, :class:`SteerRunSettings`, :class:`SteerEvalSettings`. Malformed
values are refused here, as one-line errors naming the option and the fix, so the Python API gets
the same checks as the command line. Texts are the texts (the command reads ``@FILE`` first). No
torch, no models: checks that need a plugin (method options, scorer) or the files (a vector folder,
a replaceable ``out``) are the ``prepare_*`` functions of :mod:`kvbridge.steer.stages`. ``dtype``,
``device`` and ``--json`` are loading and printing, not settings.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass

from kvbridge.errors import KVBridgeError, names_value, path_value, whole_number
from kvbridge.settings_fields import check_kinds, mismatch_option, nonempty, option, out_option, overwrite_option
from kvbridge.settings_fields import seed_option

#: the arms of ``steer eval`` (:mod:`kvbridge.steer.evaluate`), and those a sweep multiplies by default
ARMS = ("none", "visible", "pack", "kv", "actadd", "random")
SWEPT = ("kv", "actadd", "random")


# the sampling options steer run and steer eval share, declared once
def _max_new_tokens():
    return option(48, "", kind=("count", 1), show_default=True)


def _temperature():
    return option(0.7, "", kind=("real", 0, {"min_open": True}), show_default=True)


def _top_p():
    return option(0.9, "", kind="share", show_default=True)


def _path(value, flag: str, *, required: bool = False):
    return path_value(value, flag, required=required, error=KVBridgeError)


def _text(value, flag: str, *, required: bool = False) -> None:
    if (value is not None or required) and not isinstance(value, str):
        raise KVBridgeError(f"{flag} must be text, got {type(value).__name__}", f"pass {flag} as a str")


def _floats(value, flag: str) -> tuple:
    """``"0.5,2"`` or a sequence -> finite floats (a one-line error naming ``flag`` otherwise)."""
    from kvbridge.steer.edit import coefficient

    if value is None or value == "":
        return ()
    parts = [x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str) else list(value)
    return tuple(coefficient(x, flag) for x in parts)


@dataclass(frozen=True)
class SteerBuildSettings:
    """``steer build``: a vector from ``pairs`` written to ``out`` (each field's help is its option's)."""

    pairs: str = option(
        help='JSONL of contrastive pairs: {"positive": TEXT or chat turns, "negative": ...} per line.',
        kind=("path", {}),
        required=True,
    )
    out: str = out_option("Vector folder to write.", MISSING, required=True)
    method: str = option(
        "mean",
        "Mean of the differences, or their first principal component.",
        kind=("choice", ("mean", "pca")),
        show_default=True,
    )
    position: str = option(
        "last",
        "last: the last cached position (second-to-last token: generation consumes the final one); "
        "final: the last token; span: the mean over a [[...]] marked span.",
        kind=("choice", ("last", "final", "span")),
        show_default=True,
    )
    key_space: str = option(
        "content",
        "content: keys with RoPE stripped (rotated to each position when applied); rotated: as cached.",
        kind=("choice", ("content", "rotated")),
        show_default=True,
    )
    tokenizer: str | None = option(None, "Tokenizer path (default: MODEL's own tokenizer).")
    overwrite: bool = overwrite_option("Replace an existing vector folder.")

    def __post_init__(self) -> None:
        object.__setattr__(self, "pairs", _path(self.pairs, "--pairs", required=True))
        object.__setattr__(self, "out", _path(self.out, "--out", required=True))
        object.__setattr__(self, "tokenizer", _path(self.tokenizer, "--tokenizer"))
        check_kinds(self)  # --method, --position, --key-space


@dataclass(frozen=True)
class SteerTransferSettings:
    """``steer transfer``: the vector folder ``vector`` (built on the pair's source) moved through the
    fitted ``mapping`` to the pair's target, written to ``out``."""

    vector: str
    mapping: str = option(help="Mapping folder (kvbridge fit).", kind=("path", {}), required=True)
    out: str = out_option("Vector folder to write (for the target).", MISSING, required=True)
    overwrite: bool = overwrite_option("Replace an existing vector folder.")
    accept_fingerprint_mismatch: bool = mismatch_option()

    def __post_init__(self) -> None:
        for name, flag in (("vector", "VECTOR_DIR"), ("mapping", "--mapping"), ("out", "--out")):
            object.__setattr__(self, name, _path(getattr(self, name), flag, required=True))


@dataclass(frozen=True)
class SteerRunSettings:
    """``steer run``: ``prompt`` continued steered and unsteered (same seed); ``ck``, ``cv``, ``alpha``,
    ``ca`` are shortcuts for method options, applied when given; ``chat``: None = when the tokenizer
    has a template."""

    prompt: str = option(help="Prompt text, or @FILE (a user turn under --chat).", required=True)
    vector: str | None = option(None, "Steering vector folder (steer build).", kind=("path", {}))
    method: str = option(
        "kv-vector",
        "Steering method (kv-vector, kv-scale, kv-mix, kv-bank, actadd, or a plugin's).",
        show_default=True,
    )
    ck: float | None = option(None, "Key coefficient (kv-vector: added multiple; kv-scale: factor).", kind=("real",))
    cv: float | None = option(None, "Value coefficient (kv-vector: added multiple; kv-scale: factor).", kind=("real",))
    alpha: float | None = option(None, "kv-mix: weight of the other prompt's cache (1 = replace).", kind=("real",))
    ca: float | None = option(None, "actadd: residual coefficient.", kind=("real",))
    options: tuple = option((), "Method option key=value (repeatable).", flags=("-o", "--option"), multiple=True)
    layers: str = option("all", "Layers: all, '0,2', '1-3'.", show_default=True)
    at: str = option(
        "last",
        "Edit the prompt's last cached position, every position of --guide, or of --pack.",
        kind=("choice", ("last", "guide", "pack")),
        show_default=True,
    )
    guide: str | None = option(None, "Guide (instruction) text or @FILE for --at guide (a system turn under --chat).")
    pack: str | None = option(None, "Prefix pack folder for --at pack.", kind=("path", {}))
    other: str | None = option(None, "kv-mix: the other prompt (text or @FILE) whose cache is mixed in.")
    max_new_tokens: int = _max_new_tokens()
    seed: int = seed_option("Sampling seed (both runs).")
    greedy: bool = option(False, "Greedy decoding instead of sampling.", flag=True)
    temperature: float = _temperature()
    top_p: float = _top_p()
    chat: bool | None = option(
        None,
        "Render the prompt with the chat template (default: when the tokenizer has one).",
        flags=("--chat/--no-chat",),
    )

    def __post_init__(self) -> None:
        _text(self.prompt, "--prompt", required=True)
        _text(self.guide, "--guide")
        _text(self.other, "--other")
        object.__setattr__(self, "vector", _path(self.vector, "--vector"))
        object.__setattr__(self, "pack", _path(self.pack, "--pack"))
        object.__setattr__(self, "options", tuple(str(o) for o in (self.options or ())))
        nonempty(self.method, "--method", "name a steering method (`kvbridge plugins` lists them)", KVBridgeError)
        check_kinds(self)  # --ck, --cv, --alpha, --ca, --at, --max-new-tokens, --seed, --temperature, --top-p
        if self.at == "guide" and not self.guide:
            raise KVBridgeError("--at guide needs --guide TEXT", "pass the guide (instruction) to steer")
        if self.at == "pack" and not self.pack:
            raise KVBridgeError("--at pack needs --pack DIR", "pass a prefix pack folder (kvbridge pack save)")


@dataclass(frozen=True)
class SteerEvalSettings:
    """``steer eval``: behaviour rate per arm over ``samples`` seeds; library-only fields: ``sweep_arms``
    (default kv, actadd, random and the ``extra`` vectors), ``random_seed`` (the random arm's direction),
    ``bootstrap`` (resamples of the paired intervals). :func:`kvbridge.steer.evaluate.evaluate` takes
    the same object with the vector, scorer and extra vectors loaded."""

    vector: str = option(help="Steering vector folder.", kind=("path", {}), required=True)
    prompt: str = option(help="Prompt text or @FILE (a user turn under --chat).", required=True)
    scorer: str = option(
        help="Behaviour scorer (json_object, json_start, bullets, positive_sentiment, "
        "negative_sentiment, code_comments, or a plugin's).",
        required=True,
    )
    instruction: str | None = option(None, "The instruction for the visible and pack arms (text or @FILE).")
    arms: tuple = option(
        ARMS, "Arms to run (none is always run: it is the reference).", cli_default=",".join(ARMS), show_default=True
    )
    extra: tuple = option(
        (),
        "NAME=DIR: another vector for this model (e.g. moved from another model), run as an arm like kv (repeatable).",
        multiple=True,
    )
    samples: int = option(64, "Seeds 0..N-1 per arm.", kind=("count", 1), show_default=True)
    max_new_tokens: int = _max_new_tokens()
    ck: float = option(0.0, "kv arms: key coefficient.", kind=("real",), show_default=True)
    cv: float = option(4.0, "kv arms: value coefficient.", kind=("real",), show_default=True)
    ca: float = option(4.0, "actadd arm: residual coefficient.", kind=("real",), show_default=True)
    layers: str = option("all", "Layers of the kv arms (and actadd unless --actadd-layers).", show_default=True)
    actadd_layers: str = option("", "Layers of the actadd arm (default: --layers).")
    at: str = option(
        "last",
        "kv arms edit the prompt's last cached position, or every cached prompt position.",
        kind=("choice", ("last", "prompt")),
        show_default=True,
    )
    sweep: tuple = option((), "Coefficient multipliers for kv / actadd / random, e.g. 0.25,0.5,1,2,4.", cli_default="")
    sweep_samples: int = option(0, "Samples per sweep point (0: --samples).", kind=("count", 0))
    sweep_arms: tuple = ()
    random_seed: int = 0
    bootstrap: int = 2000
    temperature: float = _temperature()
    top_p: float = _top_p()
    chat: bool | None = option(
        None, "Chat template (default: when the tokenizer has one).", flags=("--chat/--no-chat",)
    )
    out: str | None = out_option("Write report.json, report.md and sweep.png here.")
    overwrite: bool = overwrite_option("Replace an existing --out report folder.")

    def __post_init__(self) -> None:
        object.__setattr__(self, "vector", _path(self.vector, "--vector", required=True))
        object.__setattr__(self, "out", _path(self.out, "--out"))
        _text(self.prompt, "--prompt", required=True)
        _text(self.instruction, "--instruction")
        nonempty(self.scorer, "--scorer", "name a scorer (`kvbridge plugins` lists them)", KVBridgeError)
        object.__setattr__(self, "arms", names_value(self.arms, "--arms", KVBridgeError))
        object.__setattr__(self, "sweep", _floats(self.sweep, "--sweep"))
        object.__setattr__(self, "sweep_arms", names_value(self.sweep_arms, "--sweep-arms", KVBridgeError))
        extra = tuple(str(e) for e in (self.extra or ()))
        for item in extra:
            name, sep, path = item.partition("=")
            if not sep or not name.strip() or not path:
                raise KVBridgeError(f"--extra {item!r} is not NAME=DIR", "pass e.g. --extra moved=vec-moved/")
        object.__setattr__(self, "extra", extra)
        check_kinds(self)  # --samples, --max-new-tokens, --ck, --cv, --ca, --at, --sweep-samples, --temperature, ...
        whole_number(self.random_seed, "random_seed", 0, KVBridgeError)
        whole_number(self.bootstrap, "bootstrap", 0, KVBridgeError)
        if self.sweep_samples > self.samples:
            raise KVBridgeError("--sweep-samples exceeds --samples", "pass --sweep-samples <= --samples")

    @property
    def extra_vectors(self) -> dict:
        """``{name: folder}`` of ``extra``."""
        return {name.strip(): path for name, _, path in (item.partition("=") for item in self.extra)}
