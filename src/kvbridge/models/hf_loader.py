"""The one place kvbridge calls transformers' loaders (models, tokenizers, configs), offline and
never running code shipped with a model.

Every call sets ``trust_remote_code=False`` and ``local_files_only=True``, so transformers neither
prompts (``Do you wish to run the custom code?``), reads stdin, nor downloads. Before that, a folder
whose ``config.json``, ``tokenizer_config.json``, ``processor_config.json`` or
``preprocessor_config.json`` holds an ``auto_map`` (a pointer to the folder's own Python classes) is
refused with a one-line :class:`RemoteCodeError` naming the entry: even where transformers would
fall back to its own class, the folder asks for code kvbridge will not run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvbridge.errors import ConfigError

#: the JSON files of a model/tokenizer folder through which transformers loads the folder's own code
CODE_POINTER_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


class RemoteCodeError(ConfigError):
    """A model or tokenizer folder asks to run its own Python code (``auto_map``)."""


def _entry_text(data: Mapping) -> str:
    """``AutoModelForCausalLM -> modeling_x.XForCausalLM`` for the first auto_map entry."""
    auto_map = data.get("auto_map")
    if isinstance(auto_map, Mapping) and auto_map:
        key = sorted(auto_map, key=str)[0]
        value = auto_map[key]
        if isinstance(value, (list, tuple)):
            value = next((v for v in value if v), None)
        return f"{key} -> {value}"
    return repr(auto_map)[:80]


def auto_map_entry(folder: str | Path) -> tuple[Path, str] | None:
    """``(file, entry text)`` of the first code pointer (``auto_map``) in ``folder``'s JSON files, or None."""
    for name in CODE_POINTER_FILES:  # not a folder: no file in it
        path = Path(folder) / name
        try:
            if not path.is_file() or path.stat().st_size > 64 << 20:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # unreadable files are the loaders' business
            continue
        for part in (data, data.get("text_config")) if isinstance(data, Mapping) else ():
            if isinstance(part, Mapping) and part.get("auto_map"):
                return path, _entry_text(part)
    return None


def refuse_remote_code(folder: str | Path) -> None:
    """A one-line :class:`RemoteCodeError` when ``folder`` points at its own Python code."""
    found = auto_map_entry(folder)
    if found is not None:
        path, entry = found
        raise RemoteCodeError(
            f"{path}: auto_map entry {entry} asks to run code shipped with the model; "
            "kvbridge never runs a model's own code",
            "use a model whose architecture transformers ships (a folder without auto_map), or a .gguf file",
        )


def quiet_transformers():
    """``transformers``, its logging at errors only and its progress bars off."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


def _safe(kwargs: dict) -> dict:
    return {"local_files_only": True, **kwargs, "trust_remote_code": False}


def model_from_pretrained(folder: str | Path, **kwargs):
    """``AutoModelForCausalLM.from_pretrained(folder, ...)``, never running the folder's code."""
    refuse_remote_code(folder)
    return quiet_transformers().AutoModelForCausalLM.from_pretrained(str(folder), **_safe(kwargs))


def tokenizer_from_pretrained(folder: str | Path, **kwargs):
    """``AutoTokenizer.from_pretrained(folder, ...)``, never running the folder's code."""
    refuse_remote_code(folder)
    return quiet_transformers().AutoTokenizer.from_pretrained(str(folder), **_safe(kwargs))


def config_for_model(model_type: str, **data: Any):
    """``AutoConfig.for_model``: transformers' own config class; a code pointer in ``data`` is dropped
    (the class is the built-in one, never the folder's)."""
    from transformers import AutoConfig

    data.pop("auto_map", None)
    return AutoConfig.for_model(model_type, **data)


def model_from_config(config, **kwargs):
    """``AutoModelForCausalLM.from_config``: transformers' own class, never code named by the config."""
    if getattr(config, "auto_map", None):
        try:
            del config.auto_map
        except AttributeError:  # pragma: no cover - a config class with a read-only attribute
            config.auto_map = {}
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config, **dict(kwargs, trust_remote_code=False))
