"""The one validation layer: every config field, manifest and CLI number is checked here.

Whatever enters kvbridge from outside (a ``config.json``, a model or pack manifest, an
artifact's tensors, a CLI option, prompt bytes) goes through one of these functions before
it is used. Each either returns the clean value or raises a one-line
:class:`~kvbridge.errors.KVBridgeError` that names the field (and the file) and says how to
fix it, so bad input never gets as far as a traceback or, worse, a silently wrong result.

Torch-free: importable from config-only commands (``describe``, ``check``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping

from kvbridge.errors import ArtifactError, ConfigError, KVBridgeError

#: deepest JSON nesting accepted in a config, manifest or artifact manifest (real ones use < 10)
MAX_JSON_DEPTH = 64
#: largest JSON file read as a config or manifest (real configs are a few KB; tokenizers are separate)
MAX_JSON_BYTES = 64 << 20
#: RoPE types that are meaningless without a scaling ``factor``
FACTOR_REQUIRED = frozenset({"linear", "dynamic", "yarn", "llama3"})


class ValidationError(KVBridgeError):
    """An input value is out of range or malformed."""


# -- numbers ---------------------------------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positive_int(value: Any, name: str, *, fix: str | None = None) -> int:
    """``value`` as an int >= 1, else a one-line error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(f"{name} must be a positive integer, got {value!r}", fix or f"pass {name} >= 1")
    return value


def non_negative_int(value: Any, name: str, *, fix: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(f"{name} must be an integer >= 0, got {value!r}", fix or f"pass {name} >= 0")
    return value


def finite_number(
    value: Any, name: str, *, positive: bool = False, non_negative: bool = False, fix: str | None = None
) -> float:
    """``value`` as a finite float (> 0 with ``positive``, >= 0 with ``non_negative``)."""
    if not _is_number(value):
        raise ValidationError(f"{name} must be a number, got {value!r}", fix or f"pass a number for {name}")
    v = float(value)
    if not math.isfinite(v):
        raise ValidationError(f"{name} must be finite, got {value!r}", fix or f"pass a finite number for {name}")
    if positive and v <= 0:
        raise ValidationError(f"{name} must be > 0, got {value!r}", fix or f"pass a positive {name}")
    if non_negative and v < 0:
        raise ValidationError(f"{name} must be >= 0, got {value!r}", fix or f"pass {name} >= 0")
    return v


# -- CLI / API run options ------------------------------------------------------------------------------
def seq_len(value: Any, max_positions: int | None = None, *, name: str = "--seq-len") -> int:
    """A sequence length: >= 2 (a pair of positions) and within the model's positions."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValidationError(f"{name} must be an integer >= 2, got {value!r}", f"use e.g. {name} 512")
    if max_positions and value > max_positions:
        raise ValidationError(
            f"{name} {value} is beyond the model's maximum positions ({max_positions})",
            f"use {name} {max_positions} or less",
        )
    return value


def tokens(value: Any, name: str = "--tokens") -> int | None:
    if value is None:
        return None
    return positive_int(value, name, fix=f"pass {name} >= 1, or leave it out to read the whole corpus")


def stride(value: Any, seq_len_: int | None = None, *, skip: int = 0, name: str = "--stride") -> int:
    """A sampling stride: >= 1 and no larger than the positions a sequence has after ``skip``."""
    positive_int(value, name, fix=f"use e.g. {name} 4")
    if seq_len_ is not None and value > seq_len_ - skip:
        raise ValidationError(
            f"{name} {value} is larger than the {seq_len_ - skip} positions of a sequence "
            f"(--seq-len {seq_len_}, --skip {skip})",
            f"use {name} {max(1, seq_len_ - skip)} or less, or a longer --seq-len",
        )
    return value


def top_k(value: Any, num_layers: int | None = None, *, name: str = "--top-k") -> int:
    """Source layers per target layer: >= 1 and at most the source's layer count."""
    positive_int(value, name, fix=f"use e.g. {name} 4")
    if num_layers is not None and value > num_layers:
        raise ValidationError(
            f"{name} {value} is larger than the source model's {num_layers} layers", f"use {name} {num_layers} or less"
        )
    return value


def memory_gib(value: Any, name: str = "--memory") -> float | None:
    if value is None:
        return None
    return finite_number(value, name, positive=True, fix=f"pass a budget in GiB, e.g. {name} 8")


def alpha(value: Any, name: str = "--alpha"):
    """A ridge strength: a finite number >= 0, or ``"auto"``."""
    if value == "auto":
        return value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValidationError(
                f"{name} must be a number or 'auto', got {value!r}", f"use e.g. {name} 0.01"
            ) from None
    return finite_number(value, name, non_negative=True, fix=f"use a finite {name} >= 0, e.g. 0.01, or 'auto'")


def utf8_text(data: bytes, where: str = "input") -> str:
    """Decode ``data`` as UTF-8, or a one-line error naming the byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(
            f"{where} is not valid UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start})",
            "pass UTF-8 text (convert it with iconv)",
        ) from None


def cli_text(value: str, what: str = "text") -> str:
    """A command-line text: bytes that were not UTF-8 reach Python as lone surrogates; refuse them."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        byte = ord(bad) - 0xDC00 if 0xDC80 <= ord(bad) <= 0xDCFF else None
        at = f"byte {byte:#04x}" if byte is not None else f"character {bad!r}"
        raise ValidationError(
            f"--{what} is not valid UTF-8 ({at} at character {exc.start})",
            f"pass the {what} as UTF-8 text (or @FILE with a UTF-8 file)",
        ) from None
    return value


# -- JSON --------------------------------------------------------------------------------------------------
def json_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting of a JSON text (strings skipped), without recursing.

    Strings and everything but brackets are dropped by two linear regex passes first, so the
    Python loop runs over the brackets alone (a manifest of a long guide is one list of numbers).
    """
    import re

    brackets = re.sub(r"[^\[\]{}]+", "", re.sub(r'"(?:[^"\\]|\\.)*"?', "", text))
    depth = best = 0
    for ch in brackets:
        if ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def parse_json(text: str, where: str, *, what: str = "JSON file", error=ConfigError) -> Any:
    """``json.loads`` with a nesting limit (:data:`MAX_JSON_DEPTH`) and one-line errors naming ``where``."""
    import json

    if "[" * (MAX_JSON_DEPTH + 1) in text or "{" * (MAX_JSON_DEPTH + 1) in text or json_depth(text) > MAX_JSON_DEPTH:
        raise error(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels", f"pass an ordinary {what}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{where}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})", f"fix or re-create the {what}"
        ) from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply", f"pass an ordinary {what}") from None


def load_json(path: Path | str, *, what: str = "JSON file", error=ConfigError, object_only: bool = True) -> Any:
    """Read a JSON file (UTF-8, at most :data:`MAX_JSON_BYTES`, depth limited); a one-line error naming the
    path otherwise."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise error(f"{path}: {size:,} bytes is too big for a {what}", f"pass the {what} itself")
        raw = path.read_bytes()
    except OSError as exc:
        from kvbridge.errors import from_exception

        raise from_exception(exc) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})", f"pass a UTF-8 {what}"
        ) from None
    data = parse_json(text, str(path), what=what, error=error)
    if object_only and not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, got {type(data).__name__}", f"pass a {what} (a JSON object)")
    return data


# -- configs: RoPE -----------------------------------------------------------------------------------------
def known_rope_types(host=None) -> set[str] | None:
    """The RoPE types the plugin host knows (built-ins included: they register like any plugin's),
    or None when the host cannot answer (the type is then left to the codec to refuse)."""
    try:
        from kvbridge.plugins import host_or_default

        return set(host_or_default(host).registry("rope_variant").names())
    except Exception:  # noqa: BLE001 - a broken plugin host must not turn into a wrong refusal here
        return None


def theta_fields(config: Mapping, keys: Iterable[str] = ("rope_theta",), *, required: bool = False) -> None:
    """Every RoPE base given in a config (even one another field overrides) is a finite number > 0
    (``required``: an absent one is refused too)."""
    for key in keys:
        theta = config.get(key)
        if (required or theta is not None) and (
            not _is_number(theta) or not math.isfinite(float(theta)) or float(theta) <= 0
        ):
            raise ConfigError(
                f"config field {key!r} must be a finite number > 0, got {theta!r}",
                f"use the model's published {key}, e.g. 10000.0 (model_type {config.get('model_type')!r})",
            )


def rope_parameters(params: Mapping, *, model_type: Any = None, where: str = "rope_scaling", host=None) -> None:
    """Check a normalised rope-parameter dict (``rope_type``, ``rope_theta``, ``factor`` ...)."""
    fix_at = f"(model_type {model_type!r})"
    theta_fields({"rope_theta": params.get("rope_theta"), "model_type": model_type}, required=True)
    rope_type = str(params.get("rope_type", "default"))
    known = known_rope_types(host)
    if known is not None and rope_type not in known:
        raise ConfigError(
            f"config field '{where}' has unknown RoPE type {rope_type!r}",
            f"use one of {', '.join(sorted(known))}, or install a plugin that registers it {fix_at}",
        )
    if "factor" in params or rope_type in FACTOR_REQUIRED:
        factor = params.get("factor")
        if factor is None:
            raise ConfigError(
                f"config field '{where}' of type {rope_type!r} has no 'factor'",
                f'add the scaling factor, e.g. "factor": 2.0 {fix_at}',
            )
        if not _is_number(factor) or not math.isfinite(float(factor)) or float(factor) <= 0:
            raise ConfigError(
                f"config field '{where}.factor' must be a finite number > 0, got {factor!r}",
                f"use a positive scaling factor, e.g. 2.0 {fix_at}",
            )
    val = params.get("original_max_position_embeddings")
    if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val <= 0):
        raise ConfigError(
            f"config field '{where}.original_max_position_embeddings' must be a positive integer, got {val!r}",
            f"fix it in the config {fix_at}",
        )


# -- manifests and artifacts ---------------------------------------------------------------------------------
def require_fields(data: Any, fields: Mapping[str, Any], where: str, *, fix: str, error=ArtifactError) -> None:
    """Each of ``fields`` (``name -> type or tuple of types``) is present in ``data`` with that type.

    Dotted names (``model.num_layers``) reach into nested objects.
    """
    if not isinstance(data, Mapping):
        raise error(f"{where} must be a JSON object, got {type(data).__name__}", fix)
    for name, types in fields.items():
        obj: Any = data
        parts = name.split(".")
        for j, part in enumerate(parts):
            if not isinstance(obj, Mapping) or part not in obj:
                raise error(f"{where} is missing field {'.'.join(parts[: j + 1])!r}", fix)
            obj = obj[part]
        want = types if isinstance(types, tuple) else (types,)
        if not any(isinstance(obj, t) and not (t in (int, float) and isinstance(obj, bool)) for t in want):
            names = " or ".join(t.__name__ for t in want)
            raise error(f"{where} field {name!r} should be {names}, got {type(obj).__name__}", fix)


def tensors_match(
    tensors: Mapping[str, Any], expected: Mapping[str, tuple], where: str, *, fix: str, allow_extra: bool = False
) -> None:
    """Every tensor has the dtype and shape the manifest implies (``name -> (dtype str, shape)``).

    A checksum says the file is the one the manifest names; this says the manifest and the
    file agree, so a file re-written with other dtypes or shapes (checksum fixed up) is refused.
    ``None`` in a shape means any size; a dtype of ``None`` means any dtype.
    """
    missing = [n for n in expected if n not in tensors]
    if missing:
        raise ArtifactError(f"{where}: tensor {missing[0]!r} is missing", fix)
    if not allow_extra:
        extra = sorted(set(tensors) - set(expected))
        if extra:
            raise ArtifactError(f"{where}: unexpected tensor {extra[0]!r}", fix)
    names: dict = {}  # dtype -> its name, once per call (the check runs per restore, over every layer)
    for name, (dtype, shape) in expected.items():
        t = tensors[name]
        if dtype is not None:
            have_dtype = names.get(t.dtype) or names.setdefault(t.dtype, str(t.dtype).removeprefix("torch."))
            allowed = dtype if isinstance(dtype, (tuple, list, set, frozenset)) else (dtype,)
            if have_dtype not in allowed:
                raise ArtifactError(
                    f"{where}: tensor {name!r} is {have_dtype}, the manifest says {' or '.join(allowed)}", fix
                )
        if shape is not None:
            have = t.shape
            if len(have) != len(shape) or any(w is not None and w != h for w, h in zip(shape, have)):
                want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
                raise ArtifactError(
                    f"{where}: tensor {name!r} has shape {list(have)}, the manifest implies {want}", fix
                )


def finite_tensors(tensors: Mapping[str, Any], where: str, *, fix: str) -> None:
    import torch

    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ArtifactError(f"{where}: tensor {name!r} has NaN/inf values", fix)


def one_of(value: Any, choices: Iterable, name: str) -> Any:
    choices = list(choices)
    if value not in choices:
        raise ValidationError(
            f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}",
            f"pass one of {', '.join(map(str, choices))}",
        )
    return value
