"""Load a zoo model and its tokenizer from the package data, through :mod:`kvbridge.models`."""

from __future__ import annotations

from pathlib import Path

import torch

from kvbridge.zoo import REBUILD, ZOO_NAMES, model_dir, zoo_dir

__all__ = ["ZOO_NAMES", "zoo_dir", "load_zoo_model", "load_zoo_tokenizer"]


def load_zoo_tokenizer(name: str = "base", root: Path | None = None):
    """The zoo's shared tokenizer (``AutoTokenizer``, offline) from one model's folder."""
    from kvbridge.models.loading import load_tokenizer_of
    from kvbridge.models.resolve import resolve

    folder = model_dir(name, root)
    _require(folder, "tokenizer.json")
    return load_tokenizer_of(resolve(str(folder)))


def load_zoo_model(
    name: str, dtype: torch.dtype = torch.float32, root: Path | None = None, device: str | torch.device = "cpu"
):
    """``(model, tokenizer)`` for zoo model ``name``: a ``LlamaForCausalLM`` in eval mode.

    The weights are stored as fp16 safetensors and cast to ``dtype`` (float32 by default).
    Nothing is downloaded. Same as ``kvbridge.models.load(f"zoo:{name}", dtype)``.
    """
    from kvbridge.models import load

    folder = model_dir(name, root)
    _require(folder, "model.safetensors")
    _require(folder, "tokenizer.json")
    lm = load(
        str(folder) if root is not None else f"zoo:{name}", dtype=str(dtype).removeprefix("torch."), device=str(device)
    )
    return lm.model, lm.tokenizer


def _require(folder: Path, file: str) -> None:
    if not (folder / file).is_file():
        from kvbridge.errors import ArtifactError

        raise ArtifactError(
            f"zoo file {folder / file} is missing",
            REBUILD,
        )
