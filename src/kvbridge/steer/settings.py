"""What each ``kvbridge steer`` subcommand (and its call in :mod:`kvbridge.steer.stages`) is asked to do.

Frozen values with the CLI's defaults, one per subcommand: :class:`SteerBuildSettings`,
:class:`SteerTransferSettings`, :class:`SteerRunSettings`, :class:`SteerEvalSettings`. Malformed
values are refused here, as one-line errors naming the option and the fix, so the Python API gets
the same checks as the command line. Texts are the texts (the command reads ``@FILE`` first). No
torch, no models: checks that need a plugin (method options, scorer) or the files (a vector folder,
a replaceable ``out``) are the ``prepare_*`` functions of :mod:`kvbridge.steer.stages`. ``dtype``,
``device`` and ``--json`` are loading and printing, not settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbridge.errors import KVBridgeError, names_value, path_value, whole_number

#: the arms of ``steer eval`` (:mod:`kvbridge.steer.evaluate`), and those a sweep multiplies by default
ARMS = ("none", "visible", "pack", "kv", "actadd", "random")
SWEPT = ("kv", "actadd", "random")


def _path(value, flag: str, *, required: bool = False):
    return path_value(value, flag, required=required, error=KVBridgeError)


def _text(value, flag: str, *, required: bool = False):
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise KVBridgeError(f"{flag} must be text, got {type(value).__name__}", f"pass {flag} as a str")
    return value


def _choice(value, flag: str, choices: tuple) -> None:
    if value not in choices:
        raise KVBridgeError(
            f"{flag} must be one of {', '.join(choices)}, got {value!r}", f"pass e.g. {flag} {choices[0]}"
        )


def _numbers(obj, names) -> None:
    from kvbridge.steer.edit import coefficient

    for name in names:
        value = getattr(obj, name)
        if value is not None:
            coefficient(value, f"--{name.replace('_', '-')}")


def _sampling(obj) -> None:
    """``temperature`` > 0 and ``top_p`` in (0, 1], as the command line's types."""
    _numbers(obj, ("temperature", "top_p"))
    if not float(obj.temperature) > 0:
        raise KVBridgeError(f"--temperature must be > 0, got {obj.temperature!r}", "pass e.g. --temperature 0.7")
    if not 0 < float(obj.top_p) <= 1:
        raise KVBridgeError(f"--top-p must be in (0, 1], got {obj.top_p!r}", "pass e.g. --top-p 0.9")


def _names(value, flag: str) -> tuple:
    return names_value(value, flag, KVBridgeError)


def _floats(value, flag: str) -> tuple:
    """``"0.5,2"`` or a sequence -> finite floats (a one-line error naming ``flag`` otherwise)."""
    from kvbridge.steer.edit import coefficient

    if value is None or value == "":
        return ()
    parts = [x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str) else list(value)
    return tuple(coefficient(x, flag) for x in parts)


@dataclass(frozen=True)
class SteerBuildSettings:
    """``steer build``: ``pairs`` (contrastive pairs JSONL) -> a vector folder ``out``; ``method``
    (mean, pca), ``position`` (last, final, span), ``key_space`` (content, rotated); ``tokenizer``: the
    tokenizer path the model was given instead of its own (recorded in the vector)."""

    pairs: str
    out: str
    method: str = "mean"
    position: str = "last"
    key_space: str = "content"
    tokenizer: str | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "pairs", _path(self.pairs, "--pairs", required=True))
        object.__setattr__(self, "out", _path(self.out, "--out", required=True))
        object.__setattr__(self, "tokenizer", _path(self.tokenizer, "--tokenizer"))
        _choice(self.method, "--method", ("mean", "pca"))
        _choice(self.position, "--position", ("last", "final", "span"))
        _choice(self.key_space, "--key-space", ("content", "rotated"))


@dataclass(frozen=True)
class SteerTransferSettings:
    """``steer transfer``: the vector folder ``vector`` (built on the pair's source) moved through the
    fitted ``mapping`` to the pair's target, written to ``out``."""

    vector: str
    mapping: str
    out: str
    overwrite: bool = False

    def __post_init__(self) -> None:
        for name, flag in (("vector", "VECTOR_DIR"), ("mapping", "--mapping"), ("out", "--out")):
            object.__setattr__(self, name, _path(getattr(self, name), flag, required=True))


@dataclass(frozen=True)
class SteerRunSettings:
    """``steer run``: ``prompt`` continued steered and unsteered (same seed). ``method`` with its
    ``options`` (``-o key=value``; ``ck``, ``cv``, ``alpha``, ``ca`` are shortcuts, applied when given),
    ``vector`` (a vector folder), ``layers``, ``at`` (last, guide, pack: where the edit goes; ``guide``
    text, ``pack`` folder), ``other`` (kv-mix's other prompt); sampling: ``max_new_tokens``, ``seed``,
    ``greedy``, ``temperature``, ``top_p``; ``chat``: None = when the tokenizer has a template."""

    prompt: str
    vector: str | None = None
    method: str = "kv-vector"
    ck: float | None = None
    cv: float | None = None
    alpha: float | None = None
    ca: float | None = None
    options: tuple = ()
    layers: str = "all"
    at: str = "last"
    guide: str | None = None
    pack: str | None = None
    other: str | None = None
    max_new_tokens: int = 48
    seed: int = 0
    greedy: bool = False
    temperature: float = 0.7
    top_p: float = 0.9
    chat: bool | None = None

    def __post_init__(self) -> None:
        _text(self.prompt, "--prompt", required=True)
        _text(self.guide, "--guide")
        _text(self.other, "--other")
        object.__setattr__(self, "vector", _path(self.vector, "--vector"))
        object.__setattr__(self, "pack", _path(self.pack, "--pack"))
        object.__setattr__(self, "options", tuple(str(o) for o in (self.options or ())))
        if not isinstance(self.method, str) or not self.method.strip():
            raise KVBridgeError("--method is empty", "name a steering method (`kvbridge plugins` lists them)")
        _numbers(self, ("ck", "cv", "alpha", "ca"))
        _sampling(self)
        _choice(self.at, "--at", ("last", "guide", "pack"))
        whole_number(self.max_new_tokens, "--max-new-tokens", 1, KVBridgeError)
        whole_number(self.seed, "--seed", 0, KVBridgeError)
        if self.at == "guide" and not self.guide:
            raise KVBridgeError("--at guide needs --guide TEXT", "pass the guide (instruction) to steer")
        if self.at == "pack" and not self.pack:
            raise KVBridgeError("--at pack needs --pack DIR", "pass a prefix pack folder (kvbridge pack save)")


@dataclass(frozen=True)
class SteerEvalSettings:
    """``steer eval``: behaviour rate per arm over ``samples`` seeds on ``prompt``, scored by ``scorer``.
    ``vector``: the steering vector folder; ``instruction``: the visible and pack arms' instruction;
    ``arms`` (``none`` always runs); ``extra``: ``NAME=DIR`` vectors run as arms like ``kv``;
    coefficients ``ck``, ``cv``, ``ca``; ``layers`` / ``actadd_layers``; ``at`` (last, prompt);
    ``sweep``: coefficient multipliers (``sweep_samples`` each, 0: ``samples``) of the ``sweep_arms``
    (default: kv, actadd, random and the ``extra`` vectors); ``random_seed``: the random arm's
    direction; ``bootstrap``: resamples of the paired intervals; ``out``: the report folder
    (report.json, report.md, sweep.png). :func:`kvbridge.steer.evaluate.evaluate` takes the same
    object with the vector, scorer and extra vectors loaded."""

    vector: str
    prompt: str
    scorer: str
    instruction: str | None = None
    arms: tuple = ARMS
    extra: tuple = ()
    samples: int = 64
    max_new_tokens: int = 48
    ck: float = 0.0
    cv: float = 4.0
    ca: float = 4.0
    layers: str = "all"
    actadd_layers: str = ""
    at: str = "last"
    sweep: tuple = ()
    sweep_samples: int = 0
    sweep_arms: tuple = ()
    random_seed: int = 0
    bootstrap: int = 2000
    temperature: float = 0.7
    top_p: float = 0.9
    chat: bool | None = None
    out: str | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "vector", _path(self.vector, "--vector", required=True))
        object.__setattr__(self, "out", _path(self.out, "--out"))
        _text(self.prompt, "--prompt", required=True)
        _text(self.instruction, "--instruction")
        if not isinstance(self.scorer, str) or not self.scorer.strip():
            raise KVBridgeError("--scorer is empty", "name a scorer (`kvbridge plugins` lists them)")
        object.__setattr__(self, "arms", _names(self.arms, "--arms"))
        object.__setattr__(self, "sweep", _floats(self.sweep, "--sweep"))
        object.__setattr__(self, "sweep_arms", _names(self.sweep_arms, "--sweep-arms"))
        extra = tuple(str(e) for e in (self.extra or ()))
        for item in extra:
            name, sep, path = item.partition("=")
            if not sep or not name.strip() or not path:
                raise KVBridgeError(f"--extra {item!r} is not NAME=DIR", "pass e.g. --extra moved=vec-moved/")
        object.__setattr__(self, "extra", extra)
        _numbers(self, ("ck", "cv", "ca"))
        _sampling(self)
        _choice(self.at, "--at", ("last", "prompt"))
        whole_number(self.samples, "--samples", 1, KVBridgeError)
        whole_number(self.max_new_tokens, "--max-new-tokens", 1, KVBridgeError)
        whole_number(self.sweep_samples, "--sweep-samples", 0, KVBridgeError)
        whole_number(self.random_seed, "random_seed", 0, KVBridgeError)
        whole_number(self.bootstrap, "bootstrap", 0, KVBridgeError)
        if self.sweep_samples > self.samples:
            raise KVBridgeError("--sweep-samples exceeds --samples", "pass --sweep-samples <= --samples")

    @property
    def extra_vectors(self) -> dict:
        """``{name: folder}`` of ``extra``."""
        return {name.strip(): path for name, _, path in (item.partition("=") for item in self.extra)}


__all__ = ["ARMS", "SWEPT", "SteerBuildSettings", "SteerTransferSettings", "SteerRunSettings", "SteerEvalSettings"]
