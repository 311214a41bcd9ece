"""A torch-free reader of GGUF headers: metadata, tensor table, geometry and quantization.

GGUF (llama.cpp's single-file format) is: the magic ``GGUF``, a version (2 or 3), a tensor
count and a metadata count (little-endian uint64), the metadata key/value pairs, then one
record per tensor (name, dimensions, ggml type, offset), then the aligned tensor data.
This module reads everything up to the tensor data (never a tensor byte), so ``describe``
and ``check`` on a 100 MB file take milliseconds and import neither torch nor numpy.

Large arrays (the tokenizer's token list and merges) are not decoded into Python lists:
their element count and the sha256 of their raw bytes are kept (:class:`GGUFArray`), which is
what the tokenizer fingerprint needs. :func:`to_hf_config` turns the metadata of a supported
architecture into a Hugging Face ``config.json`` mapping (the keys ``describe`` reads);
``transformers`` does its own conversion when it loads the weights.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
import mmap
import os
import struct
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbridge.errors import ConfigError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
#: arrays longer than this are kept as (type, count, sha256) instead of decoded
ARRAY_DECODE_LIMIT = 1024


def _by_id(names: str) -> dict[int, str]:
    """``{id: name}`` from names in id order, ``-`` where an id is unused."""
    return {i: name for i, name in enumerate(names.split()) if name != "-"}


# metadata value types (gguf spec); the scalar ones by struct format
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR = _by_id("<B <b <H <h <I <i <f <? - - <Q <q <d")

#: ggml tensor types by id (ggml.h); ``True`` where transformers can dequantize them (gguf-py)
GGML_TYPES: dict[int, tuple[str, bool]] = {
    i: (name, name not in ("Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64"))
    for i, name in _by_id(
        "F32 F16 Q4_0 Q4_1 - - Q5_0 Q5_1 Q8_0 Q8_1 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K IQ2_XXS IQ2_XS IQ3_XXS IQ1_S "
        "IQ4_NL IQ3_S IQ2_S IQ4_XS I8 I16 I32 I64 F64 IQ1_M BF16 - - - TQ1_0 TQ2_0 - - - MXFP4"
    ).items()
}

#: GGUF ``general.architecture`` -> transformers ``model_type`` (architectures transformers loads)
ARCH_TO_MODEL_TYPE = {a: a for a in ("llama", "mistral", "qwen2", "qwen3", "gemma2", "phi3")} | {
    "gemma3": "gemma3_text"
}


@dataclass(frozen=True)
class GGUFArray:
    """A large metadata array kept by element type, count and the sha256 of its raw bytes."""

    type: int
    count: int
    sha256: str


#: llama.cpp's ``LLAMA_FTYPE_*`` values (``general.file_type``): the mix a file was quantized as
FILE_TYPES = _by_id(
    "F32 F16 Q4_0 Q4_1 Q4_1_SOME_F16 - - Q8_0 Q5_0 Q5_1 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K "
    "IQ2_XXS IQ2_XS Q2_K_S IQ3_XS IQ3_XXS IQ1_S IQ4_NL IQ3_S IQ3_M IQ2_S IQ2_M IQ4_XS IQ1_M BF16 - - - TQ1_0 TQ2_0 MXFP4_MOE"
)


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple  # ggml order (fastest-varying dimension first)
    type: str  # ggml type name, e.g. "Q4_1"
    offset: int


@dataclass(frozen=True)
class GGUFInfo:
    """The header of a GGUF file: metadata, tensor table, and what kvbridge derives from them."""

    path: str
    version: int
    size: int
    metadata: dict = field(hash=False)
    tensors: tuple = ()

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name") or Path(self.path).stem)

    def arch_key(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def tensor_types(self) -> dict[str, int]:
        """ggml type name -> number of tensors of that type."""
        return dict(Counter(t.type for t in self.tensors))

    @property
    def quantization(self) -> str:
        """The dominant quantized type of the weight matrices (e.g. ``Q4_1``), else the float type."""
        ranked = [name for name, _ in Counter(t.type for t in self.tensors if len(t.shape) >= 2).most_common()]
        return next((name for name in ranked if name not in ("F32", "F16", "BF16")), ranked[0] if ranked else "none")

    @property
    def stated_type(self) -> str | None:
        """The file type the file states (``general.file_type``, llama.cpp's ``LLAMA_FTYPE`` names,
        e.g. ``Q4_K_M``); it can differ from :attr:`quantization`, the type most tensors have."""
        value = self.metadata.get("general.file_type")
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        return FILE_TYPES.get(value, f"file_type {value}")

    @property
    def params(self) -> int:
        """Elements of every tensor in the file (the weights a loader dequantizes)."""
        return sum(math.prod(int(d) for d in t.shape) for t in self.tensors)

    @property
    def tied_embeddings(self) -> bool:
        return not any(t.name == "output.weight" for t in self.tensors)

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return value if isinstance(value, str) else None

    def summary(self) -> dict:
        """What ``describe`` shows about the file itself."""
        return {
            "file": self.path,
            **{k: getattr(self, k) for k in ("version", "size", "architecture", "quantization")},
            "file_type": self.stated_type,
            **{k: getattr(self, k) for k in ("params", "tensor_types")},
            "tensors": len(self.tensors),
            "tied_embeddings": self.tied_embeddings,
            "chat_template": self.chat_template is not None,
            "tokenizer_model": self.metadata.get("tokenizer.ggml.model"),
        }


# -- reading --------------------------------------------------------------------------------------------
class _Truncated(Exception):
    pass


class _Reader:
    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise _Truncated()
        self.pos = start + n
        return start

    def scalar(self, vtype: int):
        fmt = _SCALAR[vtype]
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar(UINT64)
        start = self.take(n)
        return bytes(self.buf[start : start + n]).decode("utf-8", errors="replace")

    def value(self, vtype: int, where: str, full: bool = False):
        """The value of type ``vtype``; an array longer than :data:`ARRAY_DECODE_LIMIT` is a
        :class:`GGUFArray` (its digest) unless ``full``."""
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype = self.scalar(UINT32)
            count = self.scalar(UINT64)
            if etype not in _SCALAR and etype not in (STRING, ARRAY):
                raise ConfigError(f"{where}: unknown array element type {etype}", _FIX_REEXPORT)
            start = self.pos
            decode = full or count <= ARRAY_DECODE_LIMIT
            if etype in _SCALAR:  # the whole run in one step (one unpack when decoded)
                self.take(struct.calcsize(_SCALAR[etype]) * count)
                if decode:
                    return [v[0] for v in struct.iter_unpack(_SCALAR[etype], self.buf[start : self.pos])]
            elif decode:
                return [self.value(etype, where) for _ in range(count)]
            elif etype == STRING:
                for _ in range(count):  # skipped undecoded (a tokenizer's ~100K strings)
                    self.take(self.scalar(UINT64))
            else:
                for _ in range(count):
                    self.value(etype, where)
            return GGUFArray(etype, count, hashlib.sha256(self.buf[start : self.pos]).hexdigest())
        if vtype in _SCALAR:
            return self.scalar(vtype)
        raise ConfigError(f"{where}: unknown metadata value type {vtype}", _FIX_REEXPORT)


_FIX_REEXPORT = "the file is damaged or from an unknown GGUF writer; re-download or re-convert it"


def read_gguf(path: str | Path, decode: tuple = ()) -> GGUFInfo:
    """The header of the GGUF file at ``path``; one-line :class:`ConfigError` on a bad file. The
    metadata arrays named in ``decode`` are decoded whole (the tokenizer's), whatever their length."""
    path = Path(path)
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot be read ({exc.strerror or exc})", "check the path and its permissions"
        ) from None
    with fh:
        size = path.stat().st_size
        head = fh.read(4)
        if head != MAGIC:
            raise ConfigError(
                f"{path}: not a GGUF file (magic {head!r}, expected b'GGUF')",
                "pass a .gguf model file written by llama.cpp's converters",
            )
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(path, buf, size, decode)


def _parse(path: Path, buf, size: int, decode: tuple = ()) -> GGUFInfo:
    r = _Reader(buf, size)
    r.take(4)
    try:
        version = r.scalar(UINT32)
        if version not in VERSIONS:
            raise ConfigError(
                f"{path}: GGUF version {version} is not supported (only {VERSIONS})",
                "re-convert the model with a current llama.cpp convert_hf_to_gguf.py",
            )
        n_tensors, n_kv = r.scalar(UINT64), r.scalar(UINT64)
        if n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise ConfigError(
                f"{path}: implausible GGUF header ({n_tensors} tensors, {n_kv} metadata keys)", _FIX_REEXPORT
            )
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            metadata[key] = r.value(r.scalar(UINT32), f"{path}: metadata {key!r}", key in decode)
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar(UINT32)
            if n_dims > 8:
                raise ConfigError(f"{path}: tensor {name!r} has {n_dims} dimensions", _FIX_REEXPORT)
            shape = tuple(r.scalar(UINT64) for _ in range(n_dims))
            type_id = r.scalar(UINT32)
            offset = r.scalar(UINT64)
            if type_id not in GGML_TYPES:
                raise ConfigError(
                    f"{path}: tensor {name!r} has unknown ggml type {type_id}",
                    "re-quantize the model to a standard type (Q4_0, Q4_1, Q8_0, Q4_K, F16, ...)",
                )
            tensors.append(GGUFTensor(name, shape, GGML_TYPES[type_id][0], offset))
    except _Truncated:
        raise ConfigError(
            f"{path}: truncated GGUF file (the header ends at byte {size})", "re-download or re-convert the file"
        ) from None
    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0:
        raise ConfigError(f"{path}: metadata 'general.alignment' = {align!r} is invalid", _FIX_REEXPORT)
    data_start = -(-r.pos // align) * align
    for t in tensors:
        if data_start + t.offset > size:
            raise ConfigError(
                f"{path}: truncated GGUF file (tensor {t.name!r} starts past the end, byte "
                f"{data_start + t.offset} of {size})",
                "re-download or re-convert the file",
            )
    return GGUFInfo(path=str(path), version=version, size=size, metadata=metadata, tensors=tuple(tensors))


def unsupported_types(info: GGUFInfo) -> list[str]:
    """ggml types in ``info`` that transformers cannot dequantize."""
    return sorted({t.type for t in info.tensors} - {name for name, ok in GGML_TYPES.values() if ok})


# -- config -----------------------------------------------------------------------------------------------
def model_type_of(info: GGUFInfo) -> str:
    """The transformers ``model_type`` of a GGUF architecture; a one-line error when unsupported."""
    arch = info.architecture
    if not arch:
        raise ConfigError(f"{info.path}: metadata 'general.architecture' is missing", _FIX_REEXPORT)
    if arch == "llama" and "mistral" in str(info.metadata.get("general.name", "")).lower():
        return "mistral"  # llama.cpp writes Mistral as llama; transformers maps it by name too
    if arch not in ARCH_TO_MODEL_TYPE:
        raise ConfigError(
            f"{info.path}: GGUF architecture {arch!r} is not supported",
            f"use a GGUF of one of: {', '.join(sorted(ARCH_TO_MODEL_TYPE))}, or the model's Hugging Face folder",
        )
    return ARCH_TO_MODEL_TYPE[arch]


def _require(info: GGUFInfo, key: str) -> Any:
    value = info.arch_key(key)
    if value is None:
        raise ConfigError(f"{info.path}: metadata '{info.architecture}.{key}' is missing", _FIX_REEXPORT)
    if isinstance(value, list):  # per-layer values (e.g. head_count_kv): the cache needs the largest
        value = max(value)
    return value


def vocab_size_of(info: GGUFInfo) -> int | None:
    value = info.arch_key("vocab_size")
    if isinstance(value, int):
        return value
    tokens = info.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, GGUFArray):
        return tokens.count
    if isinstance(tokens, list):
        return len(tokens)
    emb = next((t for t in info.tensors if t.name == "token_embd.weight"), None)
    return int(emb.shape[-1]) if emb is not None and len(emb.shape) == 2 else None


def to_hf_config(info: GGUFInfo, dtype: str = "float32") -> dict:
    """A Hugging Face ``config.json`` mapping with the geometry of ``info`` (what describe reads)."""
    model_type = model_type_of(info)
    heads = _require(info, "attention.head_count")
    hidden = _require(info, "embedding_length")
    kv_heads = info.arch_key("attention.head_count_kv") or heads
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [],
        "num_hidden_layers": _require(info, "block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": max(kv_heads) if isinstance(kv_heads, list) else kv_heads,
        "hidden_size": hidden,
        "intermediate_size": info.arch_key("feed_forward_length"),
        "max_position_embeddings": info.arch_key("context_length", 2048),
        "rope_theta": float(info.arch_key("rope.freq_base", 10000.0)),
        "rms_norm_eps": info.arch_key("attention.layer_norm_rms_epsilon", 1e-6),
        "tie_word_embeddings": info.tied_embeddings,
        "torch_dtype": dtype,
    }
    key_len = info.arch_key("attention.key_length")
    head_dim = int(key_len) if isinstance(key_len, int) and key_len > 0 else (hidden // heads if heads else 0)
    cfg["head_dim"] = head_dim
    rot = info.arch_key("rope.dimension_count")
    if isinstance(rot, int) and head_dim and 0 < rot < head_dim:
        cfg["partial_rotary_factor"] = rot / head_dim
    vocab = vocab_size_of(info)
    if vocab:
        cfg["vocab_size"] = vocab
    scaling = info.arch_key("rope.scaling.type")
    factor = info.arch_key("rope.scaling.factor")
    if isinstance(scaling, str) and scaling not in ("", "none"):
        rs: dict[str, Any] = {"rope_type": scaling, "factor": float(factor) if factor is not None else 1.0}
        orig = info.arch_key("rope.scaling.original_context_length")
        if orig:
            rs["original_max_position_embeddings"] = int(orig)
        cfg["rope_scaling"] = rs
    window = info.arch_key("attention.sliding_window")
    if isinstance(window, int) and window > 0:
        cfg["sliding_window"] = window
    for role, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        tid = info.metadata.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(tid, int):
            cfg[f"{role}_token_id"] = tid
    return cfg


def geometry(info: GGUFInfo) -> dict:
    """The facts ``describe`` reports for a GGUF, straight from its metadata."""
    cfg = to_hf_config(info)
    return {
        "layers": cfg["num_hidden_layers"],
        "heads": cfg["num_attention_heads"],
        "kv_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"],
        "rope_theta": cfg["rope_theta"],
        "rope_scaling": cfg.get("rope_scaling"),
        "context": cfg["max_position_embeddings"],
        "tied_embeddings": cfg["tie_word_embeddings"],
        "chat_template": info.chat_template is not None,
        "quantization": info.quantization,
    }


def find_gguf(folder: Path) -> Path | None:
    """The one ``.gguf`` file in ``folder`` (None when there is none; an error when several)."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix == ".gguf")
    if len(files) > 1:
        raise ConfigError(
            f"{folder}: holds {len(files)} .gguf files ({', '.join(p.name for p in files[:4])})",
            "pass the .gguf file itself",
        )
    return files[0] if files else None


def _file_key(path) -> tuple:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


@contextmanager
def parsed_once(active: bool = True):
    """Within the block, transformers parses each GGUF file's metadata once.

    Loading a GGUF through transformers (tokenizer, config, weights) called its legacy
    ``load_gguf_checkpoint`` three times, each building a ``gguf.GGUFReader`` of the whole file
    (every metadata field, the tokenizer's ~100K strings as numpy arrays, the tensor table), and
    built gguf-py's tensor-name map once per module of the model (hundreds of times). Here the
    reader is built once per file (the weights' call reuses it: it only reads the memory-mapped
    file), the metadata-only result is computed once and each caller gets its own deep copy, and
    the name map is built once per (architecture, layers). Same calls, same results; the caches
    live only for the block (a file changed under it, by size or mtime, is read again).
    No-op without transformers / gguf-py or when ``active`` is false.
    """
    if not active:
        yield
        return
    try:
        import gguf as gguf_py
        import transformers.modeling_gguf_pytorch_utils as legacy
    except ImportError:  # pragma: no cover - transformers without GGUF support
        yield
        return
    readers: dict = {}
    results: dict = {}
    real = gguf_py.GGUFReader, legacy.load_gguf_checkpoint, gguf_py.get_tensor_name_map
    real_reader, real_load, real_names = real

    def reader(path, mode="r"):
        if mode != "r":
            return real_reader(path, mode)
        key = _file_key(path)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    def load_checkpoint(path, return_tensors=False, model_to_load=None, torch_dtype=None):
        if return_tensors:  # the weights: the cached reader, the tensors read from the mapped file
            return real_load(path, return_tensors=True, model_to_load=model_to_load, torch_dtype=torch_dtype)
        key = _file_key(path)
        if key not in results:
            results[key] = real_load(path, return_tensors=False)
        return copy.deepcopy(results[key])

    # the legacy loader imports these names inside its functions: patching the modules is enough
    name_map = functools.cache(real_names)  # one map per (architecture, layers)
    gguf_py.GGUFReader, legacy.load_gguf_checkpoint, gguf_py.get_tensor_name_map = reader, load_checkpoint, name_map
    try:
        yield
    finally:
        gguf_py.GGUFReader, legacy.load_gguf_checkpoint, gguf_py.get_tensor_name_map = real
        readers.clear()
        results.clear()
