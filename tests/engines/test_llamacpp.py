"""The llamacpp engine without llama.cpp: KVState <-> sequence-state file on tiny synthetic GGUFs
(the layout permutation, F16 rounding, token ids and positions, every refusal). The same paths
against a running llama.cpp are in tests/real/test_llamacpp_engine.py."""

from __future__ import annotations

import struct

import pytest
import torch

from kvbridge.engines import llamacpp as L
from kvbridge.engines import llamacpp_format as fmt
from kvbridge.errors import ConfigError, KVBridgeError, StateError
from kvbridge.kvstate import KVState
from tests.gguf_files import tiny_llama_metadata, tiny_llama_tensors, write_gguf


def _gguf(tmp_path, arch="llama", name="m", **changes):
    meta = tiny_llama_metadata(**changes)
    if arch != "llama":
        meta = {(k.replace("llama.", f"{arch}.", 1) if k.startswith("llama.") else k): v for k, v in meta.items()}
        meta["general.architecture"] = arch
    return write_gguf(tmp_path / f"{name}.gguf", meta, tiny_llama_tensors())


def _state(path, T=5, dtype=torch.float32, seed=0):
    spec = L.engine_model(path).spec
    g = torch.Generator().manual_seed(seed)
    shape = (1, spec.num_kv_heads, T, spec.head_dim)
    keys = tuple(torch.randn(shape, generator=g).to(dtype) for _ in range(spec.num_layers))
    values = tuple(torch.randn(shape, generator=g).to(dtype) for _ in range(spec.num_layers))
    return KVState(
        keys=keys,
        values=values,
        token_ids=torch.tensor([[1, 3, 4, 5, 3][:T]]),
        positions=torch.arange(T)[None],
        spec=spec,
    )


def test_the_engine_registers_through_the_plugin_hook(host):
    assert "llamacpp" in host.registry("engine").names()
    assert host.owner("engine", "llamacpp") == "kvbridge.builtin.engines"
    assert host.get("engine", "llamacpp") is L.ENGINE


@pytest.mark.parametrize("rotary_dim", [8, 6])
def test_the_layout_permutation_maps_half_split_rotation_onto_interleaved(rotary_dim):
    """Keys rotated half-split by the RoPE codec, re-ordered by layout_index, are the same content
    (re-ordered) rotated in the interleaved layout: the two layouts differ by that permutation only."""
    from kvbridge import rope as rope_codec
    from kvbridge.plugins import get_host
    from kvbridge.spec import RopeSpec

    head_dim = 8
    half = get_host().resolved(RopeSpec.make(head_dim=head_dim, partial_factor=rotary_dim / head_dim))
    inter = get_host().resolved(
        RopeSpec.make(head_dim=head_dim, partial_factor=rotary_dim / head_dim, interleaved=True)
    )
    content = torch.randn(1, 2, 7, head_dim, dtype=torch.float64)
    pos = torch.arange(3, 10)[None]
    idx = L.layout_index(head_dim, rotary_dim, src_interleaved=False, dst_interleaved=True)
    back = L.layout_index(head_dim, rotary_dim, src_interleaved=True, dst_interleaved=False)
    assert torch.equal(torch.arange(head_dim)[idx][back], torch.arange(head_dim))
    a = rope_codec.apply(content, pos, half)[..., idx]
    b = rope_codec.apply(content[..., idx], pos, inter)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert torch.equal(L.layout_index(8, 8, src_interleaved=False, dst_interleaved=False), torch.arange(8))


def test_llama_export_writes_llama_cpp_layout_rounded_to_f16(tmp_path):
    path = _gguf(tmp_path)
    st = _state(path)
    seq = fmt.parse(L.export_state(st, path))
    assert seq.k_type == seq.v_type == "F16" and seq.token_ids == (1, 3, 4, 5, 3) and seq.positions == tuple(range(5))
    k = st.keys[1][0].half()  # [H=2, T, D=8]
    row = seq.keys[1][2]  # cell 2: head 0's 8 dims, then head 1's
    for h in range(2):
        for i in range(4):  # llama.cpp slot 2i+j holds the checkpoint's dim j*4+i
            assert row[h * 8 + 2 * i] == k[h, 2, i] and row[h * 8 + 2 * i + 1] == k[h, 2, 4 + i]
    assert torch.equal(seq.values[1][2], st.values[1][0, :, 2].half().reshape(-1))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_export_then_import_is_the_state_rounded_once_to_f16(tmp_path, arch, dtype):
    path = _gguf(tmp_path, arch)
    st = _state(path, dtype=dtype)
    for v_trans in (False, True):
        back = L.import_state(L.export_state(st, path, v_trans=v_trans), path)
        assert back.spec.model_type == ("llama" if arch == "llama" else "qwen2") and back.dtype == torch.float32
        assert torch.equal(back.token_ids, st.token_ids) and torch.equal(back.positions, st.positions)
        for a, b in zip(back.keys + back.values, st.keys + st.values):
            assert torch.equal(a, b.half().float())
    if arch == "qwen2":  # NEOX in llama.cpp too: rows are the checkpoint's dims unpermuted
        assert torch.equal(fmt.parse(L.export_state(st, path)).keys[0][0], st.keys[0][0, :, 0].half().reshape(-1))


def test_f32_cache_and_cells_out_of_order(tmp_path):
    path = _gguf(tmp_path)
    st = _state(path)
    exact = L.import_state(L.export_state(st, path, cache_type="F32"), path)
    assert all(torch.equal(a, b) for a, b in zip(exact.keys, st.keys))
    seq = fmt.parse(L.export_state(st, path, cache_type="F32"))
    order = [3, 0, 4, 1, 2]  # llama.cpp may keep a sequence's cells in any order: import sorts by position
    shuffled = fmt.SeqState(
        **{
            **seq.__dict__,
            "positions": tuple(seq.positions[i] for i in order),
            "keys": tuple(k[order] for k in seq.keys),
            "values": tuple(v[order] for v in seq.values),
        }
    )
    again = L.import_state(fmt.write(shuffled), path)
    assert all(torch.equal(a, b) for a, b in zip(again.keys + again.values, st.keys + st.values))


def test_a_transposed_v_file_saved_to_disk_reads_back(tmp_path):
    path = _gguf(tmp_path)
    out = tmp_path / "s.llamacpp-seq"
    data = L.export_state(_state(path), path, out, v_trans=True)
    assert out.read_bytes() == data and not list(tmp_path.glob(".s.llamacpp-seq.tmp-*"))
    info = L.describe_file(out, path)
    assert info["v_trans"] and info["kv_state"]["tokens"] == 5 and info["kv_state"]["layers"] == 2


def test_export_refuses_what_llama_cpp_would_refuse(tmp_path):
    path = _gguf(tmp_path)
    other = _gguf(tmp_path, name="three", llama__block_count=3)
    st = _state(path)
    with pytest.raises(StateError, match="has 2 layers; three.gguf caches 3") as exc:
        L.export_state(st, other)
    assert "\n" not in str(exc.value)
    wide = _gguf(tmp_path, name="wide", llama__attention__head_count_kv=4)
    with pytest.raises(StateError, match="layer 0 holds K/V rows of 2x8"):
        L.export_state(st, wide)
    theta = _gguf(tmp_path, name="theta", llama__rope__freq_base=500000.0)
    with pytest.raises(StateError, match="RoPE theta 10000.0"):
        L.export_state(st, theta)
    from dataclasses import replace

    with pytest.raises(StateError, match="batch of 2"):
        L.export_state(
            replace(
                st,
                keys=tuple(k.expand(2, -1, -1, -1) for k in st.keys),
                values=tuple(v.expand(2, -1, -1, -1) for v in st.values),
                token_ids=st.token_ids.expand(2, -1),
                positions=st.positions.expand(2, -1),
            ),
            path,
        )
    with pytest.raises(StateError, match="token id 9, beyond m.gguf.s vocabulary of 6"):
        L.export_state(replace(st, token_ids=torch.tensor([[1, 2, 9, 3, 4]])), path)
    with pytest.raises(StateError, match="beyond F16's range"):
        L.export_state(replace(st, values=(st.values[0] * 1e5,) + st.values[1:]), path)
    assert L.export_state(replace(st, values=(st.values[0] * 1e5,) + st.values[1:]), path, cache_type="F32")
    with pytest.raises(ConfigError, match="cache type 'Q8_0'"):
        L.export_state(st, path, cache_type="Q8_0")
    with pytest.raises(ConfigError, match="architecture 'gemma2' is not supported by the llamacpp engine"):
        L.engine_model(_gguf(tmp_path, "gemma2", name="g"))


def test_import_refuses_files_for_another_model_and_damaged_files(tmp_path):
    path = _gguf(tmp_path)
    data = L.export_state(_state(path), path)
    three = _gguf(tmp_path, name="three", llama__block_count=3)
    with pytest.raises(StateError, match="2 layers, but three.gguf has 3 .*for another model"):
        L.import_state(data, three)
    wide = _gguf(tmp_path, name="wide", llama__attention__head_count_kv=4)
    with pytest.raises(StateError, match="rows of 16/16 values, but wide.gguf caches 32/32"):
        L.import_state(data, wide)
    with pytest.raises(KVBridgeError, match="truncated"):
        L.import_state(data[:-3], path)
    bad = bytearray(data)
    struct.pack_into("<I", bad, 4, 2)
    with pytest.raises(KVBridgeError, match="version 2 is not supported"):
        L.import_state(bytes(bad), path)
    seq = fmt.parse(data)
    with pytest.raises(StateError, match="5 cells but 0 token ids"):
        L.import_state(fmt.write(fmt.SeqState(**{**seq.__dict__, "token_ids": ()})), path)
    with pytest.raises(StateError, match="no cells"):
        L.import_state(fmt.write(fmt.SeqState(token_ids=(), positions=(), keys=(), values=())), path)
    with pytest.raises(ConfigError, match="cannot be read"):
        L.import_state(tmp_path / "missing.state", path)
