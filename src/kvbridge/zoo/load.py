"""Load a zoo model and its tokenizer from the package data, local files only."""

from __future__ import annotations

from pathlib import Path

import torch

from kvbridge.zoo import ZOO_NAMES, model_dir, zoo_dir

__all__ = ["ZOO_NAMES", "zoo_dir", "load_zoo_model", "load_zoo_tokenizer"]


def load_zoo_tokenizer(name: str = "base", root: Path | None = None):
    """The zoo's shared tokenizer (``AutoTokenizer``, offline) from one model's folder."""
    from transformers import AutoTokenizer

    folder = model_dir(name, root)
    _require(folder, "tokenizer.json")
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def load_zoo_model(name: str, dtype: torch.dtype = torch.float32, root: Path | None = None,
                   device: str | torch.device = "cpu"):
    """``(model, tokenizer)`` for zoo model ``name``: a ``LlamaForCausalLM`` in eval mode.

    The weights are stored as fp16 safetensors and cast to ``dtype`` (float32 by default).
    Nothing is downloaded (``local_files_only``).
    """
    from transformers import AutoModelForCausalLM

    folder = model_dir(name, root)
    _require(folder, "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, local_files_only=True)
    model.to(device).eval()
    return model, load_zoo_tokenizer(name, root)


def _require(folder: Path, file: str) -> None:
    if not (folder / file).is_file():
        from kvbridge.errors import ArtifactError

        raise ArtifactError(f"zoo file {folder / file} is missing",
                            "run `kvbridge zoo build --corpus PATH` (or reinstall kvbridge with its package data)")
