"""Built-in family adapters: one module per model family, registered as a kvbridge plugin.

Each ``kvbridge.builtin.families.<family>`` module defines a frozen-dataclass adapter and a
module-level ``ADAPTER``. Importing this package imports only pure-python modules (no torch,
no transformers): ``kvbridge plugins`` lists them without loading a model library.
"""

from __future__ import annotations

from importlib import import_module

from kvbridge.hookspecs import hookimpl

#: family modules, in registration order
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
    """The ``ADAPTER`` of every built-in family module, in registration order."""
    return [import_module(f"{__name__}.{name}").ADAPTER for name in FAMILY_MODULES]


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
