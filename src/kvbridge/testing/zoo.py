"""Tests' access to the embedded zoo: a trained tiny Llama, or a clean skip when it is not built."""

from __future__ import annotations


def zoo_or_skip(name: str):
    """``(model, tokenizer)`` of zoo model ``name`` (transformers' logging quiet), or ``pytest.skip``."""
    import pytest

    from kvbridge.zoo import model_dir

    if not (model_dir(name) / "model.safetensors").is_file():
        pytest.skip(f"zoo model {name!r} is not built")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    from kvbridge.zoo.load import load_zoo_model

    return load_zoo_model(name)


__all__ = ["zoo_or_skip"]
