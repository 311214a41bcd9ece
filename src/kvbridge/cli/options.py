"""Shared CLI options, model loading and formatters (one home for what several commands use).

Options: :func:`dtype_option`, :func:`device_option`, :func:`json_option`. Loading is
:func:`kvbridge.models.load` and :func:`kvbridge.models.pair.load_pair` (:func:`load_pair` adds the
stderr warning of a partial tokenizer match). Formatters: :func:`fmt_rope`, :func:`fmt_value`,
:func:`kv_bytes_per_token`; strings from files go through :func:`kvbridge.safe_text.escape`.
Importing this module imports click only.
"""

from __future__ import annotations

import json
import re
from typing import Any

import click

from kvbridge.cli.numbers import THREADS, Number
from kvbridge.dtypes import LOAD_DTYPES as DTYPE_CHOICES, dtype_bytes
from kvbridge.safe_text import escape
from kvbridge.threads import quiet_torch  # the commands' one call before a model runs


def _shared_option(*decls, **attrs):
    """A shared option's one declaration, used as ``@opt`` or ``@opt(help=...)`` (a command's own help)."""

    def decorator(func=None, *, help: str = attrs.pop("help")):  # noqa: A002 - click's name
        opt = click.option(*decls, help=help, **attrs)
        return opt(func) if func is not None else opt

    return decorator


#: ``--dtype`` (default None = the loading layer's policy: float32)
dtype_option = _shared_option(
    "--dtype",
    default=None,
    type=click.Choice(DTYPE_CHOICES),
    help="Dtype to load the model(s) in. Default float32 (half-precision checkpoints upcast, GGUF "
    "dequantized); 'auto' = the checkpoint's own dtype.",
)
#: ``--device`` (default cpu)
device_option = _shared_option(
    "--device", default="cpu", show_default=True, help="Device to load the model(s) on (cpu, cuda, cuda:1, mps)."
)
#: ``--json`` stored as ``as_json``: the one spelling every command with JSON output uses
json_option = _shared_option("--json", "as_json", is_flag=True, help="Machine-readable output.")
#: ``--tokenizer`` (default None = MODEL's own tokenizer)
tokenizer_option = _shared_option("--tokenizer", default=None, help="Tokenizer path (default: MODEL's own tokenizer).")
#: ``--threads`` (default None = torch's choice)
threads_option = _shared_option(
    "--threads", default=None, type=THREADS, help="torch threads (default: torch's choice)."
)


def loading_options(func):
    """``--tokenizer``, ``--dtype``, ``--device``: how a command that runs one model loads it."""
    return tokenizer_option(dtype_option(device_option(func)))


# -- options generated from a settings dataclass ------------------------------------------------------------
class TopK(Number):
    """``--top-k``: a whole number >= 1, ``all``, or a comma list of them (a k sweep from one pass)."""

    def __init__(self):
        super().__init__(int, 1)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and ("," in value or value.strip().lower() == "all"):
            from kvbridge.errors import ConfigError
            from kvbridge.fit.settings import parse_top_k

            try:
                out = parse_top_k(value)
            except ConfigError as exc:
                self.fail(exc.what, param, ctx)
            return (
                [v if v == "all" else super(TopK, self).convert(v, param, ctx) for v in out]
                if isinstance(out, list)
                else out
            )
        return super().convert(value, param, ctx)

    def get_metavar(self, param, ctx=None):  # noqa: D102
        return "N[,N...|all]"


def param_type(kind):
    """The click type of a settings field's ``kind`` (:mod:`kvbridge.settings_fields`)."""
    from kvbridge.cli.numbers import SEED, SHARE, count, real

    name, *args = kind if isinstance(kind, tuple) else (kind,)
    opts = args.pop() if args and isinstance(args[-1], dict) else {}
    makers = {"count": count, "real": real, "path": click.Path, "choice": lambda names: click.Choice(tuple(names))}
    if name in makers:
        return makers[name](*args, **opts)
    return {"seed": SEED, "share": SHARE, "threads": THREADS, "int": Number(int), "top_k": TopK()}[name]


def _declarations(cls, prefix: str = ""):
    """``(param name, field, Opt)`` of every option of ``cls`` and of its nested settings, in order."""
    from kvbridge.settings_fields import option_fields

    for f, opt in option_fields(cls):
        if opt.nested:
            yield from _declarations(f.default_factory, f"{prefix}{f.name}_")
        else:
            yield prefix + f.name, f, opt


def _click_option(param: str, f, opt):
    from dataclasses import MISSING

    from kvbridge.settings_fields import SAME

    flags = opt.flags or ("--" + f.name.replace("_", "-"),)
    kwargs: dict = {"help": opt.help}
    if opt.flag:
        kwargs["is_flag"] = True
    else:
        default = f.default if opt.cli_default == SAME else opt.cli_default
        if default is not MISSING and not opt.required:
            kwargs["default"] = list(default) if opt.multiple else default
        if opt.kind is not None:
            kwargs["type"] = param_type(opt.kind)
    kwargs |= {
        key: getattr(opt, key) for key in ("show_default", "multiple", "required", "metavar") if getattr(opt, key)
    }
    return click.option(*flags, param, **kwargs)


def settings_options(cls, *, after: dict | None = None):
    """A decorator adding one click option per option field of ``cls`` (nested settings included), in
    field order; ``after``: ``{field name: [option decorators]}`` placed right after that field's option
    (options of the command that are not settings: ``--json``, ``--dtype``, ``--threads``)."""

    def decorate(func):
        items = [
            item
            for param, f, opt in _declarations(cls)
            for item in (_click_option(param, f, opt), *(after or {}).get(f.name, ()))
        ]
        for item in reversed(items):  # click lists options in the order the decorators are written
            func = item(func)
        return func

    return decorate


def settings_from(cls, values: dict, prefix: str = "", *, given: dict | None = None):
    """The ``cls`` settings from a command's parsed option ``values`` (the parameters
    :func:`settings_options` added): a flag with ``invert`` is negated, a field with
    ``default_if_not_given`` keeps its own default unless the option was given; ``given``: fields
    that are not options (a command's arguments); every check of the settings runs here, before
    anything is loaded."""
    from click.core import ParameterSource

    from kvbridge.settings_fields import option_fields

    ctx = click.get_current_context(silent=True)
    kwargs = {}
    for f, opt in option_fields(cls):
        if opt.nested:
            kwargs[f.name] = settings_from(f.default_factory, values, f"{prefix}{f.name}_")
            continue
        param = prefix + f.name
        if param not in values:
            continue
        if opt.default_if_not_given and ctx is not None and ctx.get_parameter_source(param) == ParameterSource.DEFAULT:
            continue
        value = not values[param] if opt.invert else values[param]
        kwargs[f.name] = tuple(value) if opt.multiple else value
    return cls(**kwargs, **(given or {}))


# -- loading -------------------------------------------------------------------------------------------
def load_pair(
    source, target, *, dtype: str | None = None, device: str = "cpu", target_tokenizer: bool = True, host=None
):
    """:func:`kvbridge.models.pair.load_pair` for a command: a partial tokenizer match warns on stderr."""
    from kvbridge.models.pair import load_pair as _load

    pair = _load(source, target, dtype=dtype, device=device, target_tokenizer=target_tokenizer, host=host)
    if pair.tokenizer_note:
        click.echo(f"warning: tokenizers: {pair.tokenizer_note}", err=True)
    return pair


def open_tokenizer(ref: str):
    """A tokenizer from a tokenizer path (folder, tokenizer.json, vocab.json, tokenizer.model) or
    from any model reference (a .gguf's own tokenizer, zoo:NAME, smollm2 ...)."""
    from pathlib import Path

    from kvbridge.models.loading import load_tokenizer_of
    from kvbridge.models.resolve import resolve

    path = Path(ref).expanduser()
    if path.exists() and path.suffix != ".gguf" and not (path.is_dir() and any(path.glob("*.gguf"))):
        from kvbridge.models.tokenizer_load import load_tokenizer

        return load_tokenizer(path)
    return load_tokenizer_of(resolve(ref))


def open_model(model: str, tokenizer: str | None = None, *, dtype: str | None = None, device: str = "cpu"):
    """:func:`kvbridge.models.load` of MODEL, its ``tokenizer`` the one of ``--tokenizer`` when given."""
    from dataclasses import replace

    from kvbridge.models import load

    loaded = load(model, dtype=dtype, device=device, tokenizer=tokenizer is None)
    return replace(loaded, tokenizer=open_tokenizer(tokenizer)) if tokenizer else loaded


def read_guide_and_prompt(guide: str, prompt: str) -> tuple[str, str]:
    """The guide and prompt texts (``@FILE`` allowed); an empty guide is refused."""
    from kvbridge.prefix.splits import SplitError, read_text_arg

    guide_text = read_text_arg(guide, "guide")
    prompt_text = read_text_arg(prompt, "prompt")
    if not guide_text.strip():
        raise SplitError("the guide is empty", "pass a non-empty --guide TEXT (or @FILE)")
    return guide_text, prompt_text


def unescape(sep: str) -> str:
    """``\\n``, ``\\t``, ``\\r``, ``\\s`` and ``\\\\`` in a separator given on the command line."""
    table = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "s": " "}
    return re.sub(r"\\([ntrs\\])", lambda m: table[m.group(1)], sep)


# -- output ------------------------------------------------------------------------------------------------
def echo_result(data, as_json: bool, text, **dumps) -> None:
    """A command's result: ``data`` as JSON under ``--json`` (``json.dumps`` keywords: indent 2 unless given),
    else ``text``: a str or a list of lines, or a function returning one (called only without ``--json``)."""
    if as_json:
        click.echo(json.dumps(data, **{"indent": 2, **dumps}))
        return
    text = text() if callable(text) else text
    click.echo(text if isinstance(text, str) else "\n".join(text))


def echo_written(written: dict | None, as_json: bool) -> None:
    """The report files a command wrote, one stderr line (none under ``--json``)."""
    if written and not as_json:
        click.echo(f"report: {', '.join(str(p) for p in written.values())}", err=True)


# -- formatters ------------------------------------------------------------------------------------------
def kv_bytes_per_token(spec) -> int:
    """Bytes one token adds to the cache: K and V (and sparse-attention indexer keys), every KV layer, in the
    config's dtype."""
    per = sum(spec.kv_heads_of(i) * (spec.key_dim_of(i) + spec.value_dim_of(i)) for i in range(spec.num_layers))
    per += len(getattr(spec, "indexer_layers", ())) * spec.indexer_dim() if getattr(spec, "indexer_layers", ()) else 0
    return per * dtype_bytes(spec.dtype)


def fmt_rope(value: Any) -> str:
    """A RoPE value (a report's or describe's dict) as one short line."""
    if not value:
        return "-"

    def one(d: dict) -> str:
        bits = [str(d.get("type")), f"theta={float(d.get('theta', 0)):g}"]
        if d.get("partial_factor", 1.0) != 1.0:
            bits.append(f"partial={float(d['partial_factor']):.3g}")
        if d.get("interleaved"):
            bits.append("interleaved")
        factor = (d.get("scaling") or {}).get("factor")
        if isinstance(factor, (int, float)):
            bits.append(f"factor={factor:g}")
        return " ".join(bits)

    by_type = value.get("by_layer_type")
    if by_type:
        return "; ".join(f"{k.split('_')[0]}: {one(v)}" for k, v in sorted(by_type.items()))
    return one(value)


def fmt_value(name: str, value: Any) -> str:
    """One cell of a report table."""
    if name == "rope":
        return escape(fmt_rope(value))
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)  # ensure_ascii: controls come out as \u escapes
    return escape(value)


__all__ = [
    "DTYPE_CHOICES",
    "dtype_option",
    "device_option",
    "json_option",
    "threads_option",
    "loading_options",
    "echo_result",
    "echo_written",
    "quiet_torch",
    "TopK",
    "param_type",
    "settings_options",
    "settings_from",
    "load_pair",
    "open_tokenizer",
    "open_model",
    "read_guide_and_prompt",
    "unescape",
    "kv_bytes_per_token",
    "fmt_rope",
    "fmt_value",
]
