"""Tests' access to the embedded zoo: a trained tiny Llama, or a clean skip when it is not built."""

from __future__ import annotations


def zoo_or_skip(name: str):
    """``(model, tokenizer)`` of zoo model ``name`` (transformers' logging quiet), or ``pytest.skip``."""
    import pytest

    from kvbridge.zoo import model_dir

    if not (model_dir(name) / "model.safetensors").is_file():
        pytest.skip(f"zoo model {name!r} is not built")
    from kvbridge.models import load
    from kvbridge.threads import quiet_torch

    quiet_torch(None)

    loaded = load(f"zoo:{name}")
    return loaded.model, loaded.tokenizer


def one_torch_thread():
    """A fixture body (generator): torch single-threaded while it is active, the count restored after;
    tiny models are as fast on one thread and immune to a busy machine. In a conftest::

        _one_thread = pytest.fixture(scope="module", autouse=True)(one_torch_thread)
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
