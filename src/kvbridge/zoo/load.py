"""Load a zoo model: :func:`kvbridge.models.load` of ``zoo:NAME`` (or of a zoo folder given as ``root``)."""

from __future__ import annotations

from pathlib import Path

from kvbridge.zoo import model_dir


def load_zoo_model(name: str, dtype="float32", root: Path | None = None, device="cpu"):
    """``(model, tokenizer)`` of zoo model ``name``: ``kvbridge.models.load(f"zoo:{name}", dtype)`` (``dtype``
    a name or a ``torch.dtype``; ``root``: another zoo folder). Nothing is downloaded."""
    from kvbridge.models import load

    lm = load(str(model_dir(name, root)), dtype=str(dtype), device=str(device))
    return lm.model, lm.tokenizer
