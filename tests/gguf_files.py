"""Write small synthetic GGUF files for tests (header, metadata, tensor table, zero-filled data).

``write_gguf(path, metadata, tensors)`` writes any metadata (ints as uint32, or int64 when they
do not fit; floats as float32; bools; strings; lists as arrays of their first element's type)
and tensors given as ``(name, shape, ggml_type_name)`` with zero bytes of the right size.
``tiny_llama_gguf(path, **changes)`` writes a Llama-architecture file shaped like SmolLM2 but
tiny, for reader and resolver tests. These files are for metadata tests: their weights are zeros.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Iterable

from kvbridge.models.gguf import ARRAY, BOOL, FLOAT32, GGML_TYPES, INT64, STRING, UINT32

#: (elements per block, bytes per block) of the types these helpers write
BLOCKS = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q8_0": (32, 34),
    "Q8_1": (32, 36),
    "I8": (1, 1),
    "F64": (1, 8),
}
TYPE_IDS = {name: tid for tid, (name, _) in GGML_TYPES.items()}


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _typed(value: Any) -> tuple[int, bytes]:
    if isinstance(value, bool):
        return BOOL, struct.pack("<?", value)
    if isinstance(value, int):
        if 0 <= value < 2**32:
            return UINT32, struct.pack("<I", value)
        return INT64, struct.pack("<q", value)
    if isinstance(value, float):
        return FLOAT32, struct.pack("<f", value)
    if isinstance(value, str):
        return STRING, _str(value)
    if isinstance(value, (list, tuple)):
        if not value:
            return ARRAY, struct.pack("<IQ", UINT32, 0)
        etype = _typed(value[0])[0]
        body = b"".join(_typed(v)[1] for v in value)
        return ARRAY, struct.pack("<IQ", etype, len(value)) + body
    raise TypeError(f"cannot write {type(value).__name__} into GGUF metadata")


def tensor_bytes(shape: Iterable[int], type_name: str) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    per, size = BLOCKS[type_name]
    return -(-n // per) * size


def write_gguf(
    path: str | Path,
    metadata: dict,
    tensors: Iterable[tuple] = (),
    *,
    version: int = 3,
    alignment: int = 32,
    type_ids: dict | None = None,
) -> Path:
    """Write a GGUF file; ``tensors`` are ``(name, shape, type_name)`` (ggml order: fastest dim first)."""
    path = Path(path)
    tensors = list(tensors)
    ids = dict(TYPE_IDS, **(type_ids or {}))
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata)))
    for key, value in metadata.items():
        vtype, body = _typed(value)
        out += _str(key) + struct.pack("<I", vtype) + body
    offset, sizes = 0, []
    for name, shape, type_name in tensors:
        out += _str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", ids[type_name], offset)
        size = tensor_bytes(shape, type_name) if type_name in BLOCKS else 32
        sizes.append(size)
        offset += -(-size // alignment) * alignment
    out += b"\0" * (-len(out) % alignment)
    out += b"\0" * offset
    path.write_bytes(bytes(out))
    return path


def tiny_llama_metadata(**changes: Any) -> dict:
    """Llama metadata: 2 layers, 4 heads, 2 KV heads, hidden 32, a 6-token BPE vocabulary."""
    tokens = ["<unk>", "<s>", "</s>", "a", "b", "ab"]
    meta = {
        "general.architecture": "llama",
        "general.name": "tiny llama",
        "general.alignment": 32,
        "llama.block_count": 2,
        "llama.context_length": 256,
        "llama.embedding_length": 32,
        "llama.feed_forward_length": 64,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.rope.freq_base": 10000.0,
        "llama.rope.dimension_count": 8,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.vocab_size": len(tokens),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3, 1, 1, 1],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    }
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    return meta


def tiny_llama_tensors(quant: str = "Q4_1", *, tied: bool = True, layers: int = 2) -> list[tuple]:
    hidden, kv = 32, 16
    out = [
        ("token_embd.weight", (hidden, 6), "Q8_0" if quant != "F32" else "F32"),
        ("output_norm.weight", (hidden,), "F32"),
    ]
    if not tied:
        out.append(("output.weight", (hidden, 6), quant))
    for i in range(layers):
        out += [
            (f"blk.{i}.attn_q.weight", (hidden, hidden), quant),
            (f"blk.{i}.attn_k.weight", (hidden, kv), quant),
            (f"blk.{i}.attn_v.weight", (hidden, kv), quant),
            (f"blk.{i}.attn_output.weight", (hidden, hidden), quant),
            (f"blk.{i}.attn_norm.weight", (hidden,), "F32"),
        ]
    return out


def tiny_llama_gguf(path: str | Path, *, quant: str = "Q4_1", tied: bool = True, **changes: Any) -> Path:
    """A tiny Llama GGUF at ``path`` (metadata changes as ``llama__block_count=3``; None removes a key)."""
    return write_gguf(path, tiny_llama_metadata(**changes), tiny_llama_tensors(quant, tied=tied))


__all__ = ["write_gguf", "tiny_llama_gguf", "tiny_llama_metadata", "tiny_llama_tensors", "tensor_bytes"]
