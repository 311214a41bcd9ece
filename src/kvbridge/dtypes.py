"""The one dtype vocabulary: what ``--dtype`` takes, and the bytes per element of each dtype name."""

from __future__ import annotations

#: the dtypes a model can be loaded in; ``auto`` is the checkpoint's own (GGUF: float32)
LOAD_DTYPES = ("float32", "bfloat16", "float16", "auto")
#: bytes per element, by dtype name (torch's, without ``torch.``; ``auto`` counts as float32)
DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float": 4,
    "auto": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def dtype_bytes(name: str, default: int = 4) -> int:
    """Bytes per element of a dtype name (``torch.`` prefix allowed)."""
    return DTYPE_BYTES.get(str(name).removeprefix("torch."), default)
