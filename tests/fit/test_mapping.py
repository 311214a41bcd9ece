"""The dense map (few large operations) equals the plain per-layer formula, whatever the chunking."""

from __future__ import annotations

import pytest
import torch

from kvbridge.fit import mapping as mapping_mod
from kvbridge.fit.mapping import FittedMapping, LayerMap
from kvbridge.testing.planted import llama_config


def _spec(layers, kv, head_dim):
    from kvbridge.plugins import make_host

    cfg = llama_config(
        num_hidden_layers=layers,
        num_key_value_heads=kv,
        head_dim=head_dim,
        num_attention_heads=kv * 2,
        hidden_size=kv * 2 * head_dim,
    )
    return make_host(entry_points=False).adapter_for(cfg).describe(cfg)


def _mapping(src, tgt, selections, seed=0):
    g = torch.Generator().manual_seed(seed)
    fs, ft = src.num_kv_heads * src.head_dim, tgt.num_kv_heads * tgt.head_dim
    layers = [
        LayerMap(
            "dense",
            tuple(sel),
            torch.randn(len(sel) * fs, ft, generator=g),
            torch.randn(ft, generator=g),
            torch.randn(len(sel) * fs, ft, generator=g),
            torch.randn(ft, generator=g),
        )
        for sel in selections
    ]
    return FittedMapping(src, tgt, layers)


def _plain(m, tensors, name):
    """The straightforward per-layer formula: concatenate the selected layers' heads, one GEMM, reshape."""
    out = []
    for lm in m.layers:
        b, _, t, _ = tensors[0].shape
        x = torch.cat([tensors[s].double().transpose(1, 2).reshape(b, t, -1) for s in lm.sources], dim=-1)
        w, bias = (lm.wk, lm.bk) if name == "k" else (lm.wv, lm.bv)
        y = x @ w.double() + bias.double()
        out.append(y.view(b, t, m.target_spec.num_kv_heads, -1).transpose(1, 2))
    return out


@pytest.mark.parametrize("batch,tokens,block", [(1, 9, None), (3, 17, None), (2, 13, 4), (2, 13, 1)])
def test_dense_map_equals_the_plain_formula(monkeypatch, batch, tokens, block):
    src, tgt = _spec(5, 2, 16), _spec(4, 2, 8)
    m = _mapping(src, tgt, [(0, 3), (4, 1), (2,), (1, 2, 3)])  # three groups (k = 2, 1, 3)
    if block is not None:  # token blocks of 4 (13 = 4 + 4 + 5) or 1 token
        monkeypatch.setattr(mapping_mod, "TOKEN_BLOCK", block)
    g = torch.Generator().manual_seed(1)
    keys = [torch.randn(batch, 2, tokens, 16, generator=g) for _ in range(5)]
    values = [torch.randn(batch, 2, tokens, 16, generator=g) for _ in range(5)]
    out_k, out_v = m.map_tensors(keys, values)
    for name, got, tensors in (("k", out_k, keys), ("v", out_v, values)):
        for a, b in zip(got, _plain(m, tensors, name)):
            assert a.shape == (batch, 2, tokens, 8) and a.dtype == torch.float32
            assert a.stride(-1) == 1  # a view of the GEMM result: token rows of H_t·D_t, no layout copy
            assert float((a.double() - b).abs().max()) < 1e-4


def test_dense_map_keeps_a_half_precision_state_dtype():
    src, tgt = _spec(3, 1, 8), _spec(2, 2, 8)
    m = _mapping(src, tgt, [(0, 2), (1, 0)])
    keys = [torch.randn(1, 1, 6, 8).to(torch.bfloat16) for _ in range(3)]
    out_k, out_v = m.map_tensors(keys, keys, dtype=torch.bfloat16)
    ref = _plain(m, keys, "k")
    assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in out_k + out_v)
    assert all(float((a.double() - b).abs().max()) < 0.1 * float(b.abs().max()) for a, b in zip(out_k, ref))


def test_token_blocks_join_a_short_remainder():
    tb = mapping_mod.token_blocks
    assert tb(30, 8) == [(0, 8), (8, 16), (16, 24), (24, 30)]
    assert tb(25, 8) == [(0, 8), (8, 16), (16, 25)]  # 1 token left: joins the last block
    assert tb(5, 8) == [(0, 5)] and tb(0, 8) == []
    assert tb(32768, 2048) == [(a, a + 2048) for a in range(0, 32768, 2048)]
    assert tb(4097, 2048) == [(0, 2048), (2048, 4097)]


@pytest.mark.parametrize("batch,tokens", [(1, 1), (1, 3), (2, 1), (2, 3), (1, 37), (2, 37), (2, 300)])
def test_token_blocks_are_bitwise_one_gemm_over_all_tokens(monkeypatch, batch, tokens):
    """Blocks of 64 tokens (a remainder under 32 joined) give the numbers of one batched GEMM over every token."""
    src, tgt = _spec(5, 2, 32), _spec(4, 2, 32)
    m = _mapping(src, tgt, [(0, 3, 1, 2), (4, 1, 0, 3), (2, 0, 1, 4), (1, 2, 3, 0)])
    monkeypatch.setattr(mapping_mod, "TOKEN_BLOCK", 64)
    g = torch.Generator().manual_seed(2)
    keys = [torch.randn(batch, 2, tokens, 32, generator=g) for _ in range(5)]
    out_k, _ = m.map_tensors(keys, keys)
    for t, lm in enumerate(m.layers):  # one baddbmm over every batch row and token, as main did
        x = torch.stack([keys[s].transpose(1, 2) for s in lm.sources], dim=2).reshape(batch * tokens, -1)
        want = torch.baddbmm(lm.bk[None, None], x[None], lm.wk[None])[0]
        assert torch.equal(out_k[t], want.view(batch, tokens, 2, 32).transpose(1, 2))


@pytest.mark.parametrize("batch,tokens", [(1, 5), (2, 37), (2, 300)])
def test_layer_blocks_of_any_size_give_the_same_bits(monkeypatch, batch, tokens):
    """Up to TOKEN_BLOCK tokens the dense map runs per block of target layers (GATHER_BYTES of gathered
    features per ``baddbmm``): one layer per block, two, or every layer in one give the same bits."""
    src, tgt = _spec(5, 2, 32), _spec(5, 2, 32)
    m = _mapping(src, tgt, [(0, 3, 1, 2), (4, 1, 0, 3), (2, 0, 1, 4), (1, 2, 3, 0), (3, 4, 2, 1)])
    g = torch.Generator().manual_seed(3)
    keys = [torch.randn(batch, 2, tokens, 32, generator=g) for _ in range(5)]
    values = [torch.randn(batch, 2, tokens, 32, generator=g) for _ in range(5)]
    layer = 4 * batch * tokens * 4 * 2 * 32  # bytes of one target layer's gathered features
    outs = []
    for size in (1, 2 * layer, 3 * layer, 5 * layer):  # blocks of 1 / 2 / 3 (3 + 2) / 5 layers
        monkeypatch.setattr(mapping_mod, "GATHER_BYTES", size)
        k, v = m.map_tensors(keys, values)
        outs.append(torch.cat([t.reshape(-1) for t in k + v]))
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    ref = _plain(m, keys, "k")
    assert all(float((a.double() - b).abs().max()) < 1e-3 for a, b in zip(k, ref))
