"""Real-model tests: SmolLM2-135M-Instruct (``smollm2``), loaded once per session.

Marked ``real`` (``pytest -m "not real"`` leaves them out locally). A missing model (or, for the
llama.cpp engine tests, a missing llama-cpp-python binding) is a skip on a developer machine and a
FAILURE under ``CI=true`` (``make test`` installs the binding and fetches the model first).
"""

from __future__ import annotations

import os

import pytest


def _require_model():
    from kvbridge.models.known import SMOLLM2

    if not SMOLLM2.cached:
        msg = f"smollm2 is not fetched ({SMOLLM2.path}); run `kvbridge models fetch smollm2` (make test does)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    return SMOLLM2


@pytest.fixture(scope="session")
def smollm2_ref():
    _require_model()
    from kvbridge.models import resolve

    return resolve("smollm2")


@pytest.fixture(scope="session")
def smollm2(smollm2_ref):
    """The model in float32 (dequantized from Q4_1), tokenizer from the GGUF."""
    import torch

    from kvbridge.models import load

    torch.manual_seed(0)
    return load(smollm2_ref)


# -- llama.cpp (tests/real/test_llamacpp_engine.py) ----------------------------------------------
def _missing(msg: str):
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def llama_binding():
    """The pinned llama.cpp binding: a skip with the reason locally, a FAILURE under CI=true."""
    try:
        import llama_cpp
    except ImportError as exc:
        _missing(f"llama_cpp is not importable ({exc}); pip install llama-cpp-python==0.3.36 (make test does)")
    from kvbridge.engines.llamacpp_runtime import PINNED

    if llama_cpp.__version__ != PINNED:
        _missing(
            f"llama-cpp-python {llama_cpp.__version__} is installed; these tests verify the state format of "
            f"{PINNED} (make test installs it)"
        )
    return llama_cpp


@pytest.fixture(scope="module")
def llama_session(llama_binding, smollm2_ref):
    """One llama.cpp context on the SmolLM2 GGUF, one thread (deterministic, quick on a shared CPU)."""
    from kvbridge.engines.llamacpp_runtime import LlamaCppSession

    with LlamaCppSession(smollm2_ref.gguf_file, n_ctx=512, n_threads=1) as session:
        yield session
