"""Load a resolved model reference: weights, tokenizer, spec and fingerprint, with one dtype policy.

Dtype policy (the same for every command and the Python API):

- default (``dtype=None``): **float32**. Half-precision checkpoints (the zoo's fp16 files, most
  hub bf16 checkpoints) are upcast losslessly; GGUF files are dequantized to float32 by
  transformers anyway; CPU kernels are exact and fast in float32.
- ``"auto"``: the checkpoint's own dtype (``dtype`` / ``torch_dtype`` of its config; a GGUF's
  is float32, what dequantization produces).
- ``"float32"``, ``"bfloat16"``, ``"float16"``: that dtype (a GGUF is dequantized, then cast).

Nothing is downloaded (``local_files_only``); no code shipped with a model is executed
(:mod:`kvbridge.models.hf_loader` sets ``trust_remote_code=False`` and refuses ``auto_map`` folders).
"""

from __future__ import annotations

from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kvbridge.errors import ConfigError, InternalError, from_exception
from kvbridge.models.ref import ModelRef

from kvbridge.dtypes import LOAD_DTYPES as DTYPES  # noqa: E402  (the one vocabulary)
from kvbridge.plugins import host_or_default

DEFAULT_DTYPE = "float32"


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run: ``model`` (eval mode), ``tokenizer``, its ``config`` mapping, the
    resolved ``ref``, its ``spec`` (:class:`~kvbridge.spec.ModelSpec`, dtype as loaded) and
    ``fingerprint`` (``weights``: sha256 of every weight-file byte, ``config``, ``quantization``,
    ``dtype``)."""

    model: Any = field(repr=False)
    tokenizer: Any = field(repr=False)
    config: dict = field(repr=False, hash=False)
    ref: ModelRef
    spec: Any = field(repr=False)
    fingerprint: dict = field(hash=False)

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def dtype(self) -> str:
        return str(self.fingerprint.get("dtype", ""))


def dtype_for(ref: ModelRef, dtype: str | None) -> str:
    """The dtype name :func:`load` uses for ``ref`` under the policy above."""
    if dtype is None or dtype == "":
        return DEFAULT_DTYPE
    dtype = str(dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}", f"use one of: {', '.join(DTYPES)}")
    if dtype != "auto":
        return dtype
    if ref.gguf_file:
        return "float32"
    stored = str(ref.config.get("dtype") or ref.config.get("torch_dtype") or "float32").removeprefix("torch.")
    return stored if stored in DTYPES else "float32"


@contextmanager
def _no_gguf_progress(active: bool):
    """transformers' GGUF loader draws its own tqdm bar (not switched off by its logging): hide it."""
    gguf_utils = original = None
    if active:
        with suppress(ImportError):  # other transformers layouts: nothing to hide
            import transformers.modeling_gguf_pytorch_utils as gguf_utils
        original = getattr(gguf_utils, "tqdm", None)
    if original is not None:
        gguf_utils.tqdm = partial(original, disable=True)
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def load_tokenizer_of(ref: ModelRef):
    """The tokenizer of a resolved reference (the GGUF's own, or the folder's files), offline."""
    if ref.gguf_file:
        from kvbridge.models.hf_loader import RemoteCodeError, tokenizer_from_pretrained

        path = Path(ref.gguf_file)
        try:
            return tokenizer_from_pretrained(path.parent, gguf_file=path.name)
        except RemoteCodeError:
            raise
        except Exception as exc:  # noqa: BLE001 - transformers raises many kinds here
            raise ConfigError(
                f"{path}: cannot read the tokenizer ({_one_line(exc)})",
                "the GGUF needs tokenizer.ggml.* metadata (re-convert it with llama.cpp)",
            ) from None
    if not ref.folder:
        raise ConfigError(
            f"{ref.ref}: a {ref.kind} reference has no tokenizer files",
            "pass a local model folder, a .gguf file, or a model in the Hugging Face cache",
        )
    from kvbridge.models.tokenizer_load import load_tokenizer

    return load_tokenizer(ref.folder)


def require_weights(ref: ModelRef) -> None:
    """A one-line error when ``ref`` has no weights to load (a manifest record, a bare config)."""
    if not ref.has_weights:
        raise ConfigError(
            f"{ref.ref}: a {ref.kind} reference has no weights"
            + (f" (no weight files in {ref.folder})" if ref.folder else ""),
            "pass a local model folder with its weights, a .gguf file, zoo:NAME, smollm2, or a "
            "model in the Hugging Face cache",
        )


def require_folder(ref: ModelRef) -> None:
    """Weights load from a model folder or a .gguf file: a reference given as another file (a
    ``config.json``, a ``tokenizer.json``, a weight file) is refused naming it."""
    given = Path(str(ref.ref)).expanduser()
    try:
        is_file = given.is_file()
    except (OSError, ValueError):
        return
    if is_file and given.suffix != ".gguf":
        raise ConfigError(
            f"{given} is a file; loading a model needs its folder (or a .gguf file)",
            f"pass the model folder {given.parent}",
        )


def load_weights(ref: ModelRef, dtype: str, device: str = "cpu"):
    """The causal LM of ``ref`` (weights checked there by :func:`load`) in ``dtype`` on ``device``, in eval mode."""
    import torch

    from kvbridge.models.hf_loader import RemoteCodeError, model_from_pretrained

    kwargs: dict = {"dtype": getattr(torch, dtype)}
    if ref.gguf_file:
        from kvbridge.models.gguf import unsupported_types

        bad = unsupported_types(ref.gguf)
        if bad:
            raise ConfigError(
                f"{ref.gguf_file}: quantization type {', '.join(bad)} cannot be dequantized",
                "use a GGUF quantized to Q4_0/Q4_1/Q5_x/Q8_0/K-quants/F16/BF16/F32",
            )
        path = Path(ref.gguf_file)
        folder, kwargs["gguf_file"] = str(path.parent), path.name
    else:
        folder = ref.folder
    try:
        with _no_gguf_progress(bool(ref.gguf_file)):
            model = model_from_pretrained(folder, **kwargs)
    except RemoteCodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - OSError, ValueError, KeyError, safetensors errors ...
        where = ref.gguf_file or ref.folder
        known = from_exception(exc)  # the error boundary's reading: names the file / the mismatched weight
        if not isinstance(known, InternalError):
            raise ConfigError(f"{where}: cannot load the model: {known.what}", known.fix) from None
        raise ConfigError(
            f"{where}: cannot load the model ({type(exc).__name__}: {_one_line(exc)})",
            "pass a folder written by save_pretrained (config.json + weights) or a valid .gguf",
        ) from None
    from kvbridge.hf_compat import accept_cache_keyword

    return accept_cache_keyword(model.to(device).eval())


def load(ref, dtype: str | None = None, device: str = "cpu", *, host=None, tokenizer: bool = True) -> LoadedModel:
    """Resolve ``ref`` (anything :func:`kvbridge.models.resolve` takes) and load it.

    ``dtype`` follows the module's policy (default float32; ``"auto"`` = the checkpoint's);
    ``tokenizer=False`` skips the tokenizer (``LoadedModel.tokenizer`` is then None).
    """
    from kvbridge.models.resolve import resolve

    host = host_or_default(host)
    resolved = resolve(ref, host=host)
    name = dtype_for(resolved, dtype)
    require_weights(resolved)
    require_folder(resolved)
    if resolved.config:  # the config's own errors (KV heads, absurd sizes) named by field, before any weight is read
        resolved.spec(host)
    from kvbridge.models.gguf import parsed_once

    with parsed_once(bool(resolved.gguf_file)):  # tokenizer, config and weights: one parse of the file
        tok = load_tokenizer_of(resolved) if tokenizer else None
        model = load_weights(resolved, name, device)
    config = model.config.to_dict()
    spec = host.spec_of(model)  # described once, its RoPE variants resolved: the spec every stage carries
    fp = dict(resolved.fingerprint(), dtype=name, device=str(device))
    return LoadedModel(model=model, tokenizer=tok, config=config, ref=resolved, spec=spec, fingerprint=fp)


__all__ = ["load", "LoadedModel", "dtype_for", "load_weights", "load_tokenizer_of", "DTYPES", "DEFAULT_DTYPE"]
