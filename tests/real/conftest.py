"""Real-model tests: SmolLM2-135M-Instruct (``smollm2``), loaded once per session.

Marked ``real`` (``pytest -m "not real"`` leaves them out locally). A missing model is a skip
on a developer machine and a FAILURE under ``CI=true`` (``make test`` fetches it first).
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
