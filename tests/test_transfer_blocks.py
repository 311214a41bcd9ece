"""A long transfer through a fitted mapping runs in token blocks: bitwise the one-pass result."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbridge import transfer as transfer_mod
from kvbridge.fit.mapping import FittedMapping, LayerMap, token_blocks
from kvbridge.kvstate import KVState
from kvbridge.testing.planted import llama_config
from kvbridge.transfer import transfer


def _spec(layers, kv, head_dim, **overrides):
    from kvbridge.plugins import make_host

    cfg = llama_config(
        num_hidden_layers=layers,
        num_key_value_heads=kv,
        head_dim=head_dim,
        num_attention_heads=kv * 2,
        hidden_size=kv * 2 * head_dim,
        **overrides,
    )
    return make_host(entry_points=False).adapter_for(cfg).describe(cfg)


def _mapping(src, tgt, mode="dense", seed=0):
    g = torch.Generator().manual_seed(seed)
    fs, ft = src.num_kv_heads * src.head_dim, tgt.num_kv_heads * tgt.head_dim
    layers = []
    for i, sel in enumerate([(0, 2), (1,), (2, 0), (1, 2)][: tgt.num_layers]):
        if mode == "dense":
            shapes = (len(sel) * fs, ft), (ft,)
        else:  # one source (layer, head) per target head
            sel = tuple((s, (i + h) % src.num_kv_heads) for h, s in enumerate([sel[0]] * tgt.num_kv_heads))
            shapes = (tgt.num_kv_heads, src.head_dim, tgt.head_dim), (tgt.num_kv_heads, tgt.head_dim)
        w = [torch.randn(*shapes[0], generator=g) * 0.2, torch.randn(*shapes[1], generator=g)]
        layers.append(LayerMap(mode, tuple(sel), w[0], w[1], torch.randn(*shapes[0], generator=g) * 0.2, w[1] * 2))
    return FittedMapping(src, tgt, layers)


def _state(spec, batch, tokens, dtype=torch.float32, seed=1, start=0):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, spec.num_kv_heads, tokens, spec.head_dim)
    return KVState(
        keys=tuple(torch.randn(shape, generator=g).to(dtype) for _ in range(spec.num_layers)),
        values=tuple(torch.randn(shape, generator=g).to(dtype) for _ in range(spec.num_layers)),
        token_ids=torch.zeros(batch, tokens, dtype=torch.long),
        positions=(start + torch.arange(tokens))[None].expand(batch, -1).clone(),
        spec=spec,
    )


def _both(monkeypatch, state, mapping, **kw):
    monkeypatch.setattr(transfer_mod, "CHUNK_TOKENS", 10**9)
    monkeypatch.setattr(transfer_mod, "BLOCKS_ABOVE", 0)
    whole = transfer(state, mapping, **kw)
    calls = []
    real = transfer_mod._transfer_blocks
    monkeypatch.setattr(transfer_mod, "_transfer_blocks", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(transfer_mod, "CHUNK_TOKENS", 8)  # blocks of 8 tokens, the last one other
    blocks = transfer(state, mapping, **kw)
    assert calls == [1]  # the block path ran
    return whole, blocks


def _same(a: KVState, b: KVState):
    assert len(a.keys) == len(b.keys) and len(a.values) == len(b.values)
    for x, y in zip(a.keys + a.values, b.keys + b.values):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
    assert torch.equal(a.positions, b.positions) and torch.equal(a.token_ids, b.token_ids)
    assert (a.rope_lengths is None) == (b.rope_lengths is None)
    if a.rope_lengths is not None:
        assert torch.equal(a.rope_lengths, b.rope_lengths)
    for f in ("spec", "rope_applied", "approximate", "indexer_keys", "meta"):
        assert getattr(a, f) == getattr(b, f), f


@pytest.mark.parametrize("mode", ["dense", "headwise"])
@pytest.mark.parametrize("batch,tokens", [(1, 30), (2, 23), (1, 25)])  # last block 6, 7, 9 tokens
def test_blocks_equal_the_one_pass_transfer(monkeypatch, mode, batch, tokens):
    src, tgt = _spec(3, 2, 16), _spec(4, 2, 32)
    m = _mapping(src, tgt, mode)
    whole, blocks = _both(monkeypatch, _state(src, batch, tokens), m)
    _same(whole, blocks)
    assert blocks.approximate and blocks.rope_applied and blocks.num_tokens == tokens


def test_blocks_equal_at_other_positions_and_half_precision(monkeypatch):
    src = _spec(3, 2, 16, torch_dtype="bfloat16")
    tgt = _spec(2, 1, 32, torch_dtype="bfloat16")
    m = _mapping(src, tgt)
    state = _state(src, 2, 19, dtype=torch.bfloat16)
    whole, blocks = _both(monkeypatch, state, m, target_positions=torch.arange(100, 119)[None])
    _same(whole, blocks)
    assert blocks.keys[0].dtype == getattr(torch, tgt.dtype)  # rounded once, at the end


def test_blocks_use_the_whole_cache_forward_length_for_a_stateful_rope(monkeypatch):
    # dynamic NTK: the table depends on the forward's length (max position + 1), past 16 positions
    rope = {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 16}
    src, tgt = _spec(3, 2, 16, **rope), _spec(2, 2, 16, **rope)
    assert src.rope.is_stateful and tgt.rope.is_stateful
    m = _mapping(src, tgt)
    state = _state(src, 1, 40)
    whole, blocks = _both(monkeypatch, state, m)
    _same(whole, blocks)
    assert blocks.rope_lengths is not None and int(blocks.rope_lengths.max()) == 40
    # and the tables did change with the length: the first block alone maps otherwise
    first = transfer(state.slice_tokens(0, 8), m)
    assert not torch.equal(first.keys[0], blocks.keys[0][:, :, :8])


def test_a_short_transfer_and_an_unmarked_mapping_take_one_pass(monkeypatch):
    src, tgt = _spec(3, 2, 16), _spec(2, 2, 16)
    m = _mapping(src, tgt)
    calls = []
    monkeypatch.setattr(transfer_mod, "_transfer_blocks", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(transfer_mod, "CHUNK_TOKENS", 8)
    monkeypatch.setattr(transfer_mod, "BLOCKS_ABOVE", 20)
    transfer(_state(src, 1, 8), m)  # not more than one block
    transfer(_state(src, 1, 20), m)  # not more than BLOCKS_ABOVE tokens
    unmarked = type("Wrapped", (), {"map_content": m.map_content, "exact": False, "target_spec": tgt})()
    transfer(_state(src, 1, 30), unmarked)  # a mapping that does not say it maps token by token

    class Mixing(FittedMapping):  # a subclass with its own map_tensors: not taken for per-token
        def map_tensors(self, keys, values, *, dtype=torch.float32):
            return super().map_tensors(keys, values, dtype=dtype)

    mixing = Mixing(m.source_spec, m.target_spec, m.layers)
    assert m.per_token and not mixing.per_token
    transfer(_state(src, 1, 30), mixing)
    assert calls == []


def test_the_dense_map_reuses_its_buffers_and_returns_the_same_numbers():
    src, tgt = _spec(3, 2, 16), _spec(4, 2, 32)
    m = _mapping(src, tgt)
    work: dict = {}
    for tokens in (12, 5, 12):  # a shorter call takes the front of the same buffers
        s = _state(src, 2, tokens, seed=tokens)
        fresh_k, fresh_v = m.map_tensors(s.keys, s.values)
        got_k, got_v = m.map_tensors(s.keys, s.values, work=work)
        assert all(torch.equal(a, b) for a, b in zip(fresh_k + fresh_v, got_k + got_v))
        ptrs = {id(t) for t in work.values()}
        if tokens == 12 and len(ptrs) and "seen" in locals():
            assert ptrs == seen  # noqa: F821 - the buffers of the first call, reused
        seen = ptrs
    assert work  # the buffers were kept


def test_token_blocks_join_a_short_remainder():
    assert token_blocks(30, 8) == [(0, 8), (8, 16), (16, 24), (24, 30)]
    assert token_blocks(25, 8) == [(0, 8), (8, 16), (16, 25)]
    assert token_blocks(5, 8) == [(0, 5)]
    assert token_blocks(32768, 2048) == [(a, a + 2048) for a in range(0, 32768, 2048)]
    assert token_blocks(4097, 2048) == [(0, 2048), (2048, 4097)]


def test_kvstate_fields_not_lost_by_blocks(monkeypatch):
    src, tgt = _spec(3, 2, 16), _spec(2, 2, 16)
    state = dataclasses.replace(_state(src, 1, 20), meta={"note": "x"})
    whole, blocks = _both(monkeypatch, state, _mapping(src, tgt))
    _same(whole, blocks)
    assert blocks.meta == {"note": "x"}


def _bench_module(monkeypatch, name: str):
    """A script of ``bench/`` imported here (the folder on ``sys.path`` for this test only)."""
    import importlib
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    return importlib.import_module(name)


def _faults_children(monkeypatch, tokens: int, modes) -> dict:
    """``bench_map_faults.child`` per mode at ``tokens`` (one round, one call), in this process: the
    transfer's block settings and torch's thread count restored after."""
    monkeypatch.setattr(transfer_mod, "BLOCKS_ABOVE", transfer_mod.BLOCKS_ABOVE)  # the blocks mode sets it
    monkeypatch.setattr(transfer_mod, "CHUNK_TOKENS", transfer_mod.CHUNK_TOKENS)  # MODE@TOKENS sets it
    bench = _bench_module(monkeypatch, "bench_map_faults")
    threads = torch.get_num_threads()
    try:
        return {m: bench.child(m, tokens, 1, 1) for m in modes}
    finally:
        torch.set_num_threads(threads)


def test_bench_map_faults_stage_modes_time_the_transfer_s_own_work(monkeypatch):
    """bench/bench_map_faults.py's ``steps``, ``apply`` and ``blocks`` modes end in the transfer's own
    output (sha256 equal), so the stage split it prints is of the work the transfer does."""
    runs = _faults_children(monkeypatch, 1100, ("transfer", "steps", "apply", "blocks"))
    assert len({r["sha"] for r in runs.values()}) == 1, {m: r["sha"] for m, r in runs.items()}
    assert len(runs["steps"]["stages"]) == 3 and all(w > 0 for w, _ in runs["steps"]["stages"])
    assert runs["transfer"]["stages"] is None
    # --detail's per-child figures: every timed call, the threads' CPU time (the main one named), vmstat
    assert len(runs["steps"]["walls"]) == 1 and runs["steps"]["busy"][0] > 0
    assert runs["steps"]["named"].get("MainThread", 0) > 0 and "pgfault" in runs["steps"]["vmstat"]


def test_bench_map_faults_split_modes_time_the_block_transfer_s_own_work(monkeypatch):
    """bench/bench_map_faults.py's ``split`` modes (the block path's stages) end in the transfer's own
    output, at the block size asked, and ``splitwarm`` allocates nothing in its timed call."""
    runs = _faults_children(monkeypatch, 2100, ("transfer", "split", "splitwarm", "split@512"))
    bench_map_faults = _bench_module(monkeypatch, "bench_map_faults")
    assert len({r["sha"] for r in runs.values()}) == 1, {m: r["sha"] for m, r in runs.items()}
    assert runs["transfer"].get("split") is None
    assert [runs[m]["split"]["count"] for m in ("split", "splitwarm", "split@512")] == [2, 2, 4]
    for m in ("split", "splitwarm", "split@512"):
        st = runs[m]["split"]["stages"]
        assert set(st) == set(bench_map_faults.SPLIT_STAGES) and st["map"][0] > 0 and st["copy"][0] > 0
    assert runs["split"]["split"]["stages"]["alloc"][0] > 0 and runs["splitwarm"]["split"]["stages"]["alloc"] == [
        0.0,
        0,
    ]


def test_bench_gemm_threads_stages_times_bitwise_equal_variants_of_the_map(monkeypatch, capsys):
    """bench/bench_gemm_threads.py --stages: every map variant it times (gather sizes, populate off,
    results reused) is checked torch.equal to the first, and each row names its two busiest threads."""
    from kvbridge.fit import mapping as mapping_mod

    bench_gemm_threads = _bench_module(monkeypatch, "bench_gemm_threads")

    threads, gather = torch.get_num_threads(), mapping_mod.GATHER_BYTES
    try:
        bench_gemm_threads.stages(64, 1, 1)
    finally:
        torch.set_num_threads(threads)
    assert mapping_mod.GATHER_BYTES == gather  # restored
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 10 and rows[1].startswith("| floor | ")  # header + 9 variants
    assert all(float(r.split("|")[2]) > 0 for r in rows[1:])


def test_the_block_path_populates_its_target_cache_and_keeps_the_bits(monkeypatch):
    # every target tensor is populated once when allocated (at two threads its first touch split over
    # them, BENCHMARKS.md "5. Where the 32K transfer's time goes"); the bits stay the one pass's
    from kvbridge import buffers

    src, tgt = _spec(3, 2, 16), _spec(4, 2, 32)
    m = _mapping(src, tgt)
    state = _state(src, 2, 600)
    populated, real = [], buffers.populate
    monkeypatch.setattr(buffers, "HUGE_PAGE_MIN", 64 << 10)  # these 300 KiB outputs populated as a 32K cache's are
    monkeypatch.setattr(buffers, "populate", lambda t, *a, **k: populated.append(t.data_ptr()) or real(t, *a, **k))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        whole, blocks = _both(monkeypatch, state, m)
    finally:
        torch.set_num_threads(threads)
    _same(whole, blocks)
    assert {t.data_ptr() for t in blocks.keys + blocks.values} <= set(populated)
