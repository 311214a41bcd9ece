"""llama.cpp's sequence-state file: the layout written byte by byte from the format's description,
round trips, and a one-line refusal for every damaged or foreign file."""

from __future__ import annotations

import struct

import pytest
import torch

from kvbridge.engines import llamacpp_format as fmt
from kvbridge.errors import ArtifactError


def _state(cells=3, layers=2, width=4, v_trans=False, dtype=torch.float16, tokens=None):
    g = torch.Generator().manual_seed(cells * 10 + layers)
    keys = tuple(torch.randn(cells, width, generator=g).to(dtype) for _ in range(layers))
    values = tuple(torch.randn(cells, width, generator=g).to(dtype) for _ in range(layers))
    name = {torch.float16: "F16", torch.float32: "F32", torch.bfloat16: "BF16"}[dtype]
    return fmt.SeqState(
        token_ids=tuple(range(7, 7 + cells)) if tokens is None else tokens,
        positions=tuple(range(cells)),
        keys=keys,
        values=values,
        k_type=name,
        v_type=name,
        v_trans=v_trans,
    )


def _by_hand(st: fmt.SeqState, seq_id: int = 0) -> bytes:
    """The file as llama.cpp's state_seq_save_file + llama_kv_cache::state_write lay it out."""
    b = struct.pack("<4sI", b"qsgg", 3)  # 'ggsq' as a little-endian u32
    b += struct.pack("<I", len(st.token_ids)) + b"".join(struct.pack("<i", t) for t in st.token_ids)
    b += struct.pack("<I", 1) + struct.pack("<I", st.num_cells)  # n_stream, cell_count
    for p in st.positions:
        b += struct.pack("<iIi", p, 1, seq_id)  # pos, n_seq_id, seq ids
    b += struct.pack("<II", int(st.v_trans), st.num_layers)
    tid = {"F32": 0, "F16": 1, "BF16": 30}
    for k in st.keys:
        b += struct.pack("<iQ", tid[st.k_type], k.shape[1] * k.element_size())
        for row in k:  # row-major: one cell's row after the other
            for x in row:
                b += x.view(torch.int16 if k.element_size() == 2 else torch.int32).reshape(1).numpy().tobytes()
    for v in st.values:
        if st.v_trans:
            b += struct.pack("<iII", tid[st.v_type], v.element_size(), v.shape[1])
            for j in range(v.shape[1]):  # transposed: per dimension, every cell
                for c in range(v.shape[0]):
                    b += (
                        v[c, j].view(torch.int16 if v.element_size() == 2 else torch.int32).reshape(1).numpy().tobytes()
                    )
        else:
            b += struct.pack("<iQ", tid[st.v_type], v.shape[1] * v.element_size())
            for row in v:
                for x in row:
                    b += x.view(torch.int16 if v.element_size() == 2 else torch.int32).reshape(1).numpy().tobytes()
    return b


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_written_bytes_are_the_documented_layout_and_read_back(v_trans, dtype):
    st = _state(v_trans=v_trans, dtype=dtype)
    data = fmt.write(st)
    assert data == _by_hand(st)
    back = fmt.parse(data)
    assert back.token_ids == st.token_ids and back.positions == st.positions and back.v_trans == v_trans
    assert back.k_type == st.k_type and back.version == fmt.VERSION
    assert all(torch.equal(a, b) for a, b in zip(back.keys + back.values, st.keys + st.values))


def test_seq_data_buffers_convert_both_ways():
    st = _state()
    data = fmt.write(st)
    buf = fmt.to_seq_data(data, seq_id=0)
    assert struct.unpack_from("<Ii", buf) == (fmt.IO_MAGIC, 0)
    assert fmt.from_seq_data(buf, st.token_ids) == data


def test_every_truncation_is_a_one_line_error():
    data = fmt.write(_state(cells=2, layers=2, width=2))
    for n in range(len(data)):
        with pytest.raises(ArtifactError, match="truncated") as exc:
            fmt.parse(data[:n], "f.state")
        assert "\n" not in str(exc.value) and "f.state" in str(exc.value)


@pytest.mark.parametrize("version", [1, 2, 4, 99])
def test_another_llama_cpp_version_is_refused_naming_it(version):
    data = bytearray(fmt.write(_state()))
    struct.pack_into("<I", data, 4, version)
    with pytest.raises(ArtifactError, match=f"version {version} is not supported") as exc:
        fmt.parse(bytes(data), "x.state")
    assert "fix:" in str(exc.value) and "\n" not in str(exc.value)


def test_other_files_are_refused():
    with pytest.raises(ArtifactError, match="not a llama.cpp sequence-state file"):
        fmt.parse(b"GGUF" + bytes(60))
    session = struct.pack("<II", 0x6767736E, 10) + bytes(40)  # a whole-context session file ('ggsn')
    with pytest.raises(ArtifactError, match="not a llama.cpp sequence-state file"):
        fmt.parse(session)
    with pytest.raises(ArtifactError, match="bytes after the end"):
        fmt.parse(fmt.write(_state()) + b"\0" * 8)


def test_quantized_cache_types_and_two_streams_are_refused():
    data = bytearray(fmt.write(_state(cells=1, layers=1, width=2)))
    at = 4 * 3 + 4 * 1 + 4 + 4 + 12 + 8  # header, one token, n_stream, cell count, one cell, v_trans + n_layer
    assert struct.unpack_from("<i", data, at)[0] == 1
    struct.pack_into("<i", data, at, 8)  # Q8_0
    with pytest.raises(ArtifactError, match="ggml type 8"):
        fmt.parse(bytes(data))
    two = fmt.write(fmt.SeqState(**{**_state().__dict__, "n_stream": 2, "stream": 1}))
    assert fmt.parse(two).stream == 1
    body = fmt.write(_state())
    head = 12 + 4 * 3  # magic, version, n_token + 3 tokens
    stream = body[head + 4 :]
    doubled = body[:head] + struct.pack("<I", 2) + stream + stream
    with pytest.raises(ArtifactError, match="both hold cells"):
        fmt.parse(doubled)
