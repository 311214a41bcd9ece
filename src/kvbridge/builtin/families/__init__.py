"""Built-in family adapters, registered as a kvbridge plugin.

A family that differs from :class:`~kvbridge.builtin.families._common.DecoderAdapter` only in
constants is a row of :mod:`kvbridge.builtin.families.table`; any other has a module
``kvbridge.builtin.families.<family>`` defining a frozen-dataclass adapter and a module-level
``ADAPTER``. Importing this package imports only pure-python modules (no torch,
no transformers): ``kvbridge plugins`` lists them without loading a model library.
"""

from __future__ import annotations

from importlib import import_module

from kvbridge.hookspecs import hookimpl

#: built-in families, in registration order (a row of ``table.py``, else the module of that name)
FAMILY_MODULES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi",
    "phi3",
    "stablelm",
    "gpt_neox",
    "gptj",
    "cohere",
    "falcon",
    "gpt2",
    "olmo2",
)


def builtin_adapters() -> list:
    """Every built-in family adapter, in registration order."""
    from kvbridge.builtin.families.table import ADAPTERS

    return [ADAPTERS.get(name) or import_module(f"{__name__}.{name}").ADAPTER for name in FAMILY_MODULES]


@hookimpl
def kvbridge_register_rope_variants(register):
    """RoPE types used by families described by the generic adapter (``proportional``)."""
    from kvbridge.builtin.families._rope_extra import VARIANTS

    for variant in VARIANTS:
        register(variant)


@hookimpl
def kvbridge_register_families(register):
    """Register every built-in family adapter."""
    for adapter in builtin_adapters():
        register(adapter)


__all__ = ["FAMILY_MODULES", "builtin_adapters", "kvbridge_register_families", "kvbridge_register_rope_variants"]
