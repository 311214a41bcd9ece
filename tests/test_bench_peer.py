"""bench/bench_peer.py: the inputs both sides get are the same maps, caches and RoPE as ours uses;
the table's arithmetic; with the peer's source exported, a tiny side-by-side agrees."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_peer.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_peer", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_inputs_are_deterministic_and_shaped():
    b = _bench()
    src, tgt = b.parse_geometry("6x2x8-5x2x16")
    one, two = b.mapping_inputs(src, tgt), b.mapping_inputs(src, tgt)
    assert len(one) == 5
    for (s1, *t1), (s2, *t2) in zip(one, two):
        assert s1 == s2 and len(set(s1)) == 4 and all(0 <= s < 6 for s in s1)
        assert all(torch.equal(x, y) for x, y in zip(t1, t2))
        assert t1[0].shape == (4 * 16, 32) and t1[1].shape == (32,)
    keys, values = b.cache_inputs(src, 7)
    assert len(keys) == 6 and keys[0].shape == (1, 2, 7, 8)
    assert torch.equal(keys[3], b.cache_inputs(src, 7)[0][3]) and not torch.equal(keys[0], values[0])


def test_bad_geometry_is_one_line():
    b = _bench()
    with pytest.raises(SystemExit, match="--geometry must look like"):
        b.parse_geometry("24x2-28x2x128")


def test_peer_weight_layout_is_the_same_affine_map():
    """The peer computes einsum("nf,hfd->nhd") + bias with [H, F, D] weights: the same numbers as x @ W + b."""
    b = _bench()
    g = torch.Generator().manual_seed(0)
    x, w, bias = torch.randn(9, 12, generator=g), torch.randn(12, 3 * 5, generator=g), torch.randn(15, generator=g)
    peer = torch.einsum("nf,hfd->nhd", x, b.peer_weight(w, 3, 5)) + bias.reshape(3, 5)
    torch.testing.assert_close(peer.reshape(9, 15), x @ w + bias)


def test_rope_factors_match_our_codec():
    """The cos / sin handed to the peer strip RoPE exactly as our KVState.strip_rope does."""
    b = _bench()
    sys.path.insert(0, str(BENCH.parent))
    from bench_fit import llama_spec

    from kvbridge.kvstate import KVState

    _, _, spec = llama_spec(2, 64, 4, 2, 16)
    keys, values = b.cache_inputs((2, 2, 16), 11)
    state = KVState(
        keys=tuple(keys),
        values=tuple(values),
        token_ids=torch.zeros(1, 11, dtype=torch.long),
        positions=torch.arange(11)[None],
        spec=spec,
    )
    cos, sin = b.rope_factors(11, 16)
    for k, ours in zip(keys, state.strip_rope().keys):
        first, second = k.chunk(2, dim=-1)
        rotated = torch.cat((-second, first), dim=-1)
        torch.testing.assert_close(ours, k * cos - rotated * sin, atol=1e-5, rtol=1e-5)


def test_fit_batches_are_synthetic_calibrations_data():
    b = _bench()
    sys.path.insert(0, str(BENCH.parent))
    from bench_fit import SyntheticCalibration

    batches, true = b.fit_batches((6, 2, 8), (5, 2, 16), 40, batch=64)
    cal = SyntheticCalibration(6, 2, 8, 5, 2, 16, 40, batch=64)
    feats, _ = cal.batches[0]
    assert true == [int(t) for t in cal.true]
    for got, name in zip(batches[0], ("xk", "yk", "xv", "yv")):
        assert torch.equal(got, feats[name])


def test_table_row_and_ratios():
    b = _bench()
    row = b.table_row("2 (default)", "map", "2,048 tokens", 0.3, 0.4, 0.2)
    assert row == "| 2 (default) | map | 2,048 tokens | 300.0 ms | 400.0 ms | 0.75 | 1.50 | 2.00 |"
    assert b.table_row(1, "fit", "8,192 obs", 12.0, 60.0, unit="s").endswith("| 12.0 s | 60.0 s | 0.20 |  |  |")
    assert b.ratio(1.0, 0.0) == "" and b.med([{"a": {"b": 1}}, {"a": {"b": 5}}, {"a": {"b": 2}}], "a", "b") == 2


@pytest.mark.skipif(
    not (Path("/tmp/peer-src/src/kvbridge/mapper.py")).is_file(),
    reason="the peer's source is not exported (python bench/bench_peer.py --export-peer COMMIT)",
)
def test_tiny_side_by_side_agrees_with_the_peer():
    b = _bench()
    args = argparse.Namespace(
        peer="/tmp/peer-src", ours=None, geometry="6x2x8-5x2x16", tokens="16", inner=1, fit_obs=64
    )
    with tempfile.TemporaryDirectory() as d:
        res = b.alternate("map", 1, 1, args, dump_dir=d)
        diffs = b.max_diff(f"{d}/ours.safetensors", f"{d}/peer.safetensors")
    assert res["ours"][0]["side"] == "ours" and res["peer"][0]["version"] == "0.2.0"
    assert diffs["map.k"] < 1e-5 and diffs["map.v"] < 1e-5
    assert diffs["transfer.k"] < 1e-5 and diffs["transfer.v"] < 1e-5
