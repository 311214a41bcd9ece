"""Write any model reference as a plain safetensors folder (config, tokenizer, weights).

Engines that load Hugging Face folders (vLLM 0.32 has no GGUF loader) and transformers itself
load the result. A ``.gguf`` reference is dequantized by transformers' GGUF loader, which then
refuses ``save_pretrained`` ("quantized with GGUF"): the model is rebuilt from its config (no
quantization record) and the dequantized state dict, then saved. The weights written are the
tensors kvbridge runs for that reference in ``dtype`` (float32 by default), so a pack made from
the reference and the folder describe the same numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvbridge.errors import ConfigError

#: files a materialized folder always holds (besides the tokenizer's)
REQUIRED = ("config.json", "model.safetensors")
KIND = "model folder"


def _plain_model(model):
    """``model`` itself, or (GGUF-loaded) the same architecture rebuilt with its state dict."""
    import torch

    from kvbridge.models.hf_loader import model_from_config

    config = model.config
    if getattr(config, "quantization_config", None) is None and not getattr(model, "is_quantized", False):
        return model
    config = type(config).from_dict({k: v for k, v in config.to_dict().items() if k != "quantization_config"})
    with torch.device("meta"):
        plain = model_from_config(config, dtype=next(model.parameters()).dtype)
    plain.load_state_dict(model.state_dict(), assign=True, strict=True)
    plain.tie_weights()
    return plain.eval()


def materialize(ref, out: str | Path, *, dtype: str | None = None, overwrite: bool = False, host=None) -> dict:
    """Write ``ref`` (any model reference) to ``out`` as config + tokenizer + ``model.safetensors``.

    Returns ``{"out", "model_type", "dtype", "files", "source"}``. The folder is written atomically
    (``kvbridge.artifacts.atomic_dir``); an existing ``out`` is refused unless ``overwrite``.
    """
    from kvbridge.artifacts import atomic_dir, check_replaceable
    from kvbridge.models.loading import load

    out = Path(out)
    check_replaceable(out, KIND, overwrite=overwrite)  # before any weight is read
    loaded = load(ref, dtype=dtype, host=host)
    model = _plain_model(loaded.model)
    with atomic_dir(out, kind=KIND, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        loaded.tokenizer.save_pretrained(tmp)
        gen = Path(tmp) / "generation_config.json"
        if gen.is_file():  # a GGUF's generation defaults are not the checkpoint's: keep only the token ids
            data = json.loads(gen.read_text())
            keep = {k: v for k, v in data.items() if k.endswith("token_id") or k == "transformers_version"}
            gen.write_text(json.dumps(keep, indent=2) + "\n")
        files = sorted(p.name for p in Path(tmp).iterdir())
    for name in REQUIRED:
        if name not in files:
            raise ConfigError(f"{out}: transformers wrote no {name}", "report this model reference")
    return {
        "out": str(out),
        "model_type": loaded.config.get("model_type"),
        "dtype": loaded.dtype,
        "files": files,
        "source": loaded.ref.gguf_file or loaded.ref.folder or loaded.ref.ref,
    }
