"""llama.cpp's sequence-state file (``llama_state_seq_save_file`` / ``load_file``), read and written.

Verified against the llama.cpp vendored by ``llama-cpp-python==0.3.36`` (``src/llama-context.cpp``
``state_seq_save_file`` / ``state_seq_load_file``, ``src/llama-kv-cache.cpp`` ``state_write`` /
``state_write_meta`` / ``state_write_data`` and their readers). All integers little-endian::

    u32 magic 'ggsq' (0x67677371)   u32 version (3)
    u32 n_token   i32 token[n_token]              the prompt the caller saved with the state
    u32 n_stream                                  KV streams of the context (1 unless split per sequence)
    per stream:
      u32 cell_count                              0: the stream holds nothing of this sequence
      per cell:   i32 pos  u32 n_seq_id  [ext: i32 x, y, tok: M-RoPE / PLE only, not read]  i32 seq_id[n_seq_id]
      u32 v_trans  u32 n_layer
      per layer:  i32 k_type  u64 k_row_bytes  K rows [cell_count][n_embd_k_gqa]
      v_trans = 0: per layer  i32 v_type  u64 v_row_bytes  V rows [cell_count][n_embd_v_gqa]
      v_trans = 1: per layer  i32 v_type  u32 v_elem_bytes  u32 n_embd_v_gqa  V [n_embd_v_gqa][cell_count]

A K/V row is the cell's heads one after the other (``n_embd_k_gqa = kv_heads * head_dim``), in
llama.cpp's own rotary layout (:mod:`kvbridge.engines.llamacpp` maps it). ``v_trans`` is set when
the context runs without flash attention. ``llama_state_seq_get_data`` (in memory) writes the
same per-stream part after its own ``u32 0xaf143cd8, i32 seq_id`` header and without the magic,
version and tokens (:func:`to_seq_data`). llama.cpp refuses a file whose magic or version it
does not know; so does this reader, and it also refuses a truncated file, trailing bytes (an
SWA model writes two caches: not read here), quantized cache types and more than one stream
holding cells.

This module imports torch only to hold the rows (no model, no llama.cpp binding).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from kvbridge.errors import ArtifactError

MAGIC = 0x67677371  # 'ggsq' (LLAMA_STATE_SEQ_MAGIC)
VERSION = 3  # LLAMA_STATE_SEQ_VERSION of the pinned llama.cpp
#: the in-memory header of llama_state_seq_get_data / set_data in the pinned llama.cpp
IO_MAGIC = 0xAF143CD8
#: ggml types kvbridge reads and writes in a cache: id -> (name, torch dtype)
CACHE_TYPES = {0: ("F32", torch.float32), 1: ("F16", torch.float16), 30: ("BF16", torch.bfloat16)}
TYPE_IDS = {name: tid for tid, (name, _) in CACHE_TYPES.items()}
_FIX_VERSION = (
    "save the state with llama-cpp-python 0.3.36 (llama.cpp sequence-state version 3), or re-export it from kvbridge"
)


@dataclass(frozen=True)
class SeqState:
    """One sequence of a llama.cpp KV cache, as the sequence-state file holds it.

    ``keys[l]`` / ``values[l]`` are ``[cells, n_embd_gqa]`` tensors in the cache's dtype (V
    un-transposed whatever ``v_trans`` was); cells are in file order with their ``positions``.
    """

    token_ids: tuple  # the prompt saved with the state (may be empty)
    positions: tuple  # per cell
    keys: tuple  # per layer Tensor [cells, n_embd_k_gqa]
    values: tuple  # per layer Tensor [cells, n_embd_v_gqa]
    k_type: str = "F16"
    v_type: str = "F16"
    v_trans: bool = False
    n_stream: int = 1
    stream: int = 0  # the stream holding the cells
    version: int = VERSION

    @property
    def num_cells(self) -> int:
        return len(self.positions)

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def summary(self) -> dict:
        return {
            "format": "llama.cpp sequence state",
            "version": self.version,
            "tokens": len(self.token_ids),
            "cells": self.num_cells,
            "layers": self.num_layers,
            "n_stream": self.n_stream,
            "v_trans": self.v_trans,
            "k_type": self.k_type,
            "v_type": self.v_type,
            "k_row": int(self.keys[0].shape[1]) if self.keys else 0,
            "v_row": int(self.values[0].shape[1]) if self.values else 0,
            "positions": [min(self.positions), max(self.positions)] if self.positions else [],
        }


class StateFileError(ArtifactError):
    """A llama.cpp state file kvbridge cannot read: unknown version, truncated, damaged."""


class _Reader:
    def __init__(self, data: bytes, where: str):
        self.data, self.where, self.pos = memoryview(data), where, 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise StateFileError(
                f"{self.where}: truncated llama.cpp state file (it ends at byte {len(self.data)}, "
                f"{what} needs bytes {self.pos}..{self.pos + n})",
                "save or export the state again (the file was cut short)",
            )
        view = self.data[self.pos : self.pos + n]
        self.pos += n
        return view

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def i32(self, what: str) -> int:
        return struct.unpack("<i", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]


def _type_of(tid: int, what: str, where: str) -> tuple:
    if tid not in CACHE_TYPES:
        raise StateFileError(
            f"{where}: {what} has ggml type {tid}, which kvbridge does not convert (it reads "
            f"{', '.join(n for n, _ in CACHE_TYPES.values())} caches; a quantized cache is also "
            "Hadamard-rotated by llama.cpp)",
            "run the llama.cpp context with the default F16 cache (type_k / type_v unset)",
        )
    return CACHE_TYPES[tid]


def _rows(buf: memoryview, dtype: torch.dtype, rows: int, cols: int) -> torch.Tensor:
    if rows * cols == 0:
        return torch.empty(rows, cols, dtype=dtype)
    return torch.frombuffer(bytearray(buf), dtype=dtype).reshape(rows, cols)


def parse(data: bytes, where: str = "state") -> SeqState:
    """The :class:`SeqState` of a sequence-state file's bytes; a one-line error when it is not one."""
    r = _Reader(data, where)
    magic, version = r.u32("magic"), r.u32("version")  # a file cut short is refused by the reader
    if magic != MAGIC:
        raise StateFileError(
            f"{where}: not a llama.cpp sequence-state file (magic 0x{magic:08x}, expected 0x{MAGIC:08x} 'ggsq')",
            "pass a file written by llama_state_seq_save_file or kvbridge's export",
        )
    if version != VERSION:
        raise StateFileError(
            f"{where}: llama.cpp sequence-state version {version} is not supported (kvbridge reads "
            f"version {VERSION}, the format of the pinned llama-cpp-python 0.3.36)",
            _FIX_VERSION,
        )
    n_tok = r.u32("the token count")
    tokens = tuple(struct.unpack(f"<{n_tok}i", r.take(4 * n_tok, f"{n_tok} token ids")))
    n_stream = r.u32("the stream count")
    if not 1 <= n_stream <= 4096:
        raise StateFileError(
            f"{where}: implausible stream count {n_stream} in a llama.cpp state file",
            "the file is damaged; save or export it again",
        )
    found = None
    for s in range(n_stream):
        cells = r.u32(f"stream {s} cell count")
        if cells == 0:
            continue
        if found is not None:
            raise StateFileError(
                f"{where}: streams {found[0]} and {s} both hold cells of the sequence",
                "save one sequence (llama_state_seq_save_file with its seq id)",
            )
        found = (s, _stream(r, cells, where))
    if r.pos != len(data):
        raise StateFileError(
            f"{where}: {len(data) - r.pos} bytes after the end of the sequence state (a llama.cpp "
            "layout kvbridge does not read, e.g. an SWA model's two caches)",
            "export states of models with one KV cache (llama, qwen2, qwen3)",
        )
    if found is None:
        return SeqState(token_ids=tokens, positions=(), keys=(), values=(), n_stream=n_stream)
    return SeqState(token_ids=tokens, n_stream=n_stream, stream=found[0], version=version, **found[1])


def _stream(r: _Reader, cells: int, where: str):
    if cells > 1 << 24:
        raise StateFileError(f"{where}: implausible cell count {cells}", "the file is damaged; save it again")
    positions = []
    for i in range(cells):
        pos, n_seq = r.i32(f"cell {i} position"), r.u32(f"cell {i} sequence count")
        if n_seq > 4096:
            raise StateFileError(f"{where}: cell {i} claims {n_seq} sequence ids", "the file is damaged")
        r.take(4 * n_seq, f"cell {i} sequence ids")
        positions.append(pos)
    v_trans, n_layer = r.u32("v_trans"), r.u32("the layer count")
    if v_trans not in (0, 1) or not 0 < n_layer <= 4096:
        raise StateFileError(
            f"{where}: implausible cache header (v_trans {v_trans}, {n_layer} layers)",
            "the file is damaged, or from another llama.cpp layout; save it again",
        )
    keys, k_types = [], set()
    for layer in range(n_layer):
        name, dtype = _type_of(r.i32(f"layer {layer} key type"), f"layer {layer} keys", where)
        keys.append(_row_block(r, cells, layer, "key", name, dtype, where))
        k_types.add(name)
    values, v_types = [], set()
    for layer in range(n_layer):
        name, dtype = _type_of(r.i32(f"layer {layer} value type"), f"layer {layer} values", where)
        size = torch.tensor([], dtype=dtype).element_size()
        if v_trans:
            el, width = r.u32(f"layer {layer} value element size"), r.u32(f"layer {layer} value width")
            if el != size:
                raise StateFileError(
                    f"{where}: layer {layer} value elements of {el} bytes for type {name}", "the file is damaged"
                )
            v = _rows(r.take(cells * width * size, f"layer {layer} values"), dtype, width, cells).t().contiguous()
        else:
            v = _row_block(r, cells, layer, "value", name, dtype, where)
        values.append(v)
        v_types.add(name)
    if len(k_types) > 1 or len(v_types) > 1:
        raise StateFileError(
            f"{where}: mixed cache types across layers ({sorted(k_types | v_types)})",
            "kvbridge reads caches of one K type and one V type",
        )
    return {
        "positions": tuple(positions),
        "v_trans": bool(v_trans),
        "k_type": k_types.pop(),
        "v_type": v_types.pop(),
        "keys": tuple(keys),
        "values": tuple(values),
    }


def _row_block(r: _Reader, cells: int, layer: int, word: str, name: str, dtype, where: str) -> torch.Tensor:
    """One layer's ``cells`` key or value rows (``word``), each a whole number of ``name`` values."""
    size = torch.tensor([], dtype=dtype).element_size()
    row = r.u64(f"layer {layer} {word} row size")
    if row % size or row == 0:
        raise StateFileError(
            f"{where}: layer {layer} {word} rows of {row} bytes are not whole {name} values", "the file is damaged"
        )
    return _rows(r.take(cells * row, f"layer {layer} {word}s"), dtype, cells, row // size)


def write(state: SeqState, *, seq_id: int = 0) -> bytes:
    """The sequence-state file bytes of ``state`` (what ``llama_state_seq_load_file`` reads)."""
    return _head(state.token_ids) + _memory(state, seq_id)


def _head(tokens) -> bytes:
    """The file's magic, version and the prompt's token ids."""
    return struct.pack(f"<III{len(tokens)}i", MAGIC, VERSION, len(tokens), *tokens)


def _memory(state: SeqState, seq_id: int) -> bytes:
    cells = state.num_cells
    out = [struct.pack("<I", state.n_stream)]
    for s in range(state.n_stream):
        if s != state.stream or cells == 0:
            out.append(struct.pack("<I", 0))
            continue
        out.append(struct.pack("<I", cells))
        out.append(b"".join(struct.pack("<iIi", p, 1, seq_id) for p in state.positions))
        out.append(struct.pack("<II", int(state.v_trans), state.num_layers))
        k_tid, v_tid = TYPE_IDS[state.k_type], TYPE_IDS[state.v_type]
        k_dtype, v_dtype = CACHE_TYPES[k_tid][1], CACHE_TYPES[v_tid][1]
        for k in state.keys:
            k = k.to(k_dtype).contiguous()
            out += [struct.pack("<iQ", k_tid, k.shape[1] * k.element_size()), _bytes(k)]
        for v in state.values:
            v = v.to(v_dtype)
            if state.v_trans:
                out += [struct.pack("<iII", v_tid, v.element_size(), v.shape[1]), _bytes(v.t().contiguous())]
            else:
                out += [struct.pack("<iQ", v_tid, v.shape[1] * v.element_size()), _bytes(v.contiguous())]
    return b"".join(out)


def _bytes(t: torch.Tensor) -> bytes:
    # raw little-endian bytes of a contiguous CPU tensor (bf16/f16 viewed as int16, no numpy dtype needed)
    t = t.detach().cpu().contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def to_seq_data(file_bytes: bytes, seq_id: int = 0) -> bytes:
    """The ``llama_state_seq_set_data`` buffer of a sequence-state file (header swapped, tokens dropped)."""
    r = _Reader(file_bytes, "state")
    magic, version, n_tok = r.u32("magic"), r.u32("version"), r.u32("the token count")
    if magic != MAGIC or version != VERSION:
        raise StateFileError(f"state: not a version-{VERSION} llama.cpp sequence-state file", _FIX_VERSION)
    r.take(4 * n_tok, "token ids")
    return struct.pack("<Ii", IO_MAGIC, seq_id) + bytes(r.data[r.pos :])


def from_seq_data(data: bytes, token_ids=()) -> bytes:
    """The sequence-state file bytes of a ``llama_state_seq_get_data`` buffer (plus the prompt tokens)."""
    if len(data) < 8 or struct.unpack_from("<I", data)[0] != IO_MAGIC:
        raise StateFileError(
            "state buffer: not a llama_state_seq_get_data buffer of the pinned llama.cpp "
            f"(header 0x{IO_MAGIC:08x} missing)",
            _FIX_VERSION,
        )
    return _head(list(token_ids)) + bytes(data[8:])
