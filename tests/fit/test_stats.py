"""Streaming statistics: merges equal one-shot, blocks equal the full matrix, additive form."""

from __future__ import annotations

import torch

from kvbridge.fit.stats import LayerStats, MomentStats


def _data(n=600, p=6, q=4, seed=0, shift=1000.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, p, generator=g, dtype=torch.float64) * 2 + shift  # large means: the hard case
    y = x @ torch.randn(p, q, generator=g, dtype=torch.float64) + torch.randn(n, q, generator=g, dtype=torch.float64)
    return x, y


def _close(a: MomentStats, b: MomentStats, tol=1e-9):
    assert a.n == b.n
    for name in ("mean_x", "mean_y", "cxx", "cxy", "cyy"):
        ta, tb = getattr(a, name), getattr(b, name)
        scale = max(1.0, float(tb.abs().max()))
        assert float((ta - tb).abs().max()) <= tol * scale, name


def test_streaming_merge_equals_one_shot_and_direct_formula():
    x, y = _data()
    one = MomentStats(6, 4).update(x, y)
    streamed = MomentStats(6, 4)
    for i in range(0, 600, 37):  # uneven batches
        streamed.update(x[i : i + 37], y[i : i + 37])
    _close(streamed, one)
    a, b = MomentStats(6, 4).update(x[:250], y[:250]), MomentStats(6, 4).update(x[250:], y[250:])
    _close(a.merge(b), one)
    xc, yc = x - x.mean(0), y - y.mean(0)
    assert torch.allclose(one.cxx, xc.T @ xc, rtol=1e-10, atol=1e-8)
    assert torch.allclose(one.cxy, xc.T @ yc, rtol=1e-10, atol=1e-8)
    assert torch.allclose(one.cyy, (yc * yc).sum(0), rtol=1e-10, atol=1e-8)


def test_centred_accumulation_is_stable_where_raw_sums_cancel():
    x, y = _data(shift=1e7)
    s = MomentStats(6, 4)
    for i in range(0, 600, 50):
        s.update(x[i : i + 50], y[i : i + 50])
    xc = x - x.mean(0)
    ref = xc.T @ xc
    assert float((s.cxx - ref).abs().max() / ref.abs().max()) < 1e-8


def test_block_diagonal_statistics_equal_the_full_blocks():
    x, y = _data(p=8)
    full = MomentStats(8, 4).update(x, y)
    blk = MomentStats(8, 4, xx_block=4)
    for i in range(0, 600, 100):
        blk.update(x[i : i + 100], y[i : i + 100])
    assert torch.allclose(blk.cxx[1], full.cxx[4:, 4:], rtol=1e-9)
    assert torch.allclose(blk.cxy, full.cxy, rtol=1e-9)
    assert blk.nbytes() < full.nbytes()


def test_recentred_moments_are_additive():
    x, y = _data()
    parts = [MomentStats(6, 4).update(x[i : i + 200], y[i : i + 200]) for i in (0, 200, 400)]
    total = MomentStats(6, 4).update(x, y)
    mu_x, mu_y = total.mean_x, total.mean_y
    summed = [sum(p.recentred(mu_x, mu_y)[k] for p in parts) for k in ("cxx", "cxy", "cyy")]
    for got, want in zip(summed, (total.cxx, total.cxy, total.cyy)):
        assert torch.allclose(got, want, rtol=1e-9)


def test_state_dict_round_trip_and_memory_is_flat():
    x, y = _data()
    s = MomentStats(6, 4).update(x, y)
    again = MomentStats(6, 4).load_state_dict(s.state_dict("a."), "a.")
    _close(again, s, tol=0)
    before = s.nbytes()
    s.update(*_data(n=5000, seed=1))
    assert s.nbytes() == before == MomentStats.nbytes_for(6, 4)


def test_layer_stats_views_pick_the_right_rows_and_columns():
    g = torch.Generator().manual_seed(3)
    n, ls, hs, ds, lt, ht, dt = 300, 3, 2, 4, 2, 2, 3
    feats = {
        "xk": torch.randn(n, ls, hs, ds, generator=g),
        "xv": torch.randn(n, ls, hs, ds, generator=g),
        "yk": torch.randn(n, lt, ht, dt, generator=g),
        "yv": torch.randn(n, lt, ht, dt, generator=g),
    }
    held = torch.zeros(n, dtype=torch.bool)
    held[::5] = True
    dims = dict(src_heads=hs, src_dim=ds, tgt_heads=ht, tgt_dim=dt)
    jobs = {b: LayerStats(range(ls), range(lt), **dims, xx_block=b) for b in ("full", "layer", "head")}
    for job in jobs.values():
        job.update(feats, held)
    x = feats["xv"][~held][:, [2, 0]].reshape(-1, 2 * hs * ds).double()
    y = feats["yv"][~held][:, 1].reshape(-1, ht * dt).double()
    ref = MomentStats(x.shape[1], y.shape[1]).update(x, y)
    m = jobs["full"].moments("v", "train", src_layers=[2, 0], tgt_layers=[1])
    assert torch.allclose(m.cxx, ref.cxx) and torch.allclose(m.cxy, ref.cxy) and torch.allclose(m.cyy, ref.cyy)
    one = [j.moments("k", "held", src_head=(1, 1), tgt_layers=[0]) for j in jobs.values()]
    for o in one[1:]:
        assert torch.allclose(o.cxx, one[0].cxx) and torch.allclose(o.cxy, one[0].cxy)
    assert jobs["layer"].n("held") == int(held.sum())


def test_weighted_moments_match_repeated_rows_and_constant_weights_change_nothing():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(50, 6, generator=g), torch.randn(50, 3, generator=g)
    w = torch.randint(0, 4, (50,), generator=g).double()
    weighted = MomentStats(6, 3).update(x, y, weights=w)
    rep = torch.repeat_interleave(torch.arange(50), w.long())
    repeated = MomentStats(6, 3).update(x[rep], y[rep])
    for name in ("n", "mean_x", "mean_y", "cxx", "cxy", "cyy"):
        a, b = getattr(weighted, name), getattr(repeated, name)
        assert torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=1e-9), name
    ones = MomentStats(6, 3).update(x, y, weights=torch.ones(50))
    plain = MomentStats(6, 3).update(x, y)
    assert torch.allclose(ones.cxx, plain.cxx) and torch.allclose(ones.cxy, plain.cxy)


def test_a_layer_subset_is_gathered_chunk_by_chunk_with_the_same_result(monkeypatch):
    from kvbridge.fit.stats import chunk_rows

    g = torch.Generator().manual_seed(5)
    n, ls, hs, ds, lt, ht, dt = 1300, 4, 2, 8, 3, 2, 8
    feats = {
        "xk": torch.randn(n, ls, hs, ds, generator=g),
        "xv": torch.randn(n, ls, hs, ds, generator=g),
        "yk": torch.randn(n, lt, ht, dt, generator=g),
        "yv": torch.randn(n, lt, ht, dt, generator=g),
    }
    held = torch.zeros(n, dtype=torch.bool)
    held[1000:] = True  # train rows first, held-out last (what the calibration hands over)
    dims = dict(src_heads=hs, src_dim=ds, tgt_heads=ht, tgt_dim=dt)
    src, tgt = (3, 1), (1, 2)  # not all layers, not in order: no view exists
    job = LayerStats(src, tgt, **dims)
    step = chunk_rows(job.p, job.q)
    assert step < 1000  # the batch spans several chunks
    seen = []
    update = MomentStats.update

    def spy(self, x, y, *a, **k):
        seen.append(x.shape[0])
        return update(self, x, y, *a, **k)

    monkeypatch.setattr(MomentStats, "update", spy)
    job.update(feats, held)
    monkeypatch.setattr(MomentStats, "update", update)
    assert max(seen) <= step  # no layer subset of the whole batch was materialised
    for c in ("k", "v"):
        x = feats["x" + c][:, list(src)].reshape(n, -1)
        y = feats["y" + c][:, list(tgt)].reshape(n, -1)
        for split, rows in (("train", slice(0, 1000)), ("held", slice(1000, n))):
            ref = MomentStats(job.p, job.q).update(x[rows], y[rows])
            got = job.stats[(c, split)]
            assert got.n == ref.n
            for name in ("mean_x", "mean_y", "cxx", "cxy", "cyy"):  # the same chunks in the same order: bitwise
                assert torch.equal(getattr(got, name), getattr(ref, name)), (c, split, name)


def test_float32_gram_matches_float64_within_float32_rounding_and_mirrors_the_lower_half():
    """gram_dtype=float32: 1,024-row chunks centred on their mean, float32 products of the upper block
    triangle, float64 statistics: within float32 rounding of the float64 path, even with an offset
    (the chunk is centred before its products) and features spread over three decades."""
    from kvbridge.fit.plan import GRAM_STRIP

    g = torch.Generator().manual_seed(11)
    n, p, q = 2600, GRAM_STRIP + 200, 96  # two strips: a strictly-lower block is mirrored
    scale = 10.0 ** torch.linspace(-1.5, 1.5, p)
    x = (torch.randn(n, p, generator=g) * scale + 10.0).float()  # float32 input (what a calibration hands over)
    y = (x.double() @ torch.randn(p, q, generator=g, dtype=torch.float64) / p).float() + torch.randn(n, q, generator=g)
    f64 = MomentStats(p, q, gram_dtype="float64").update(x, y)
    f32 = MomentStats(p, q, gram_dtype="float32").update(x, y)
    assert f32.chunk_rows() == 1024 and f32._lower_stale  # three chunks, lower half not yet mirrored
    cxx = f32.cxx
    assert not f32._lower_stale and torch.equal(cxx, cxx.T)  # mirrored once, exactly symmetric
    for name in ("mean_x", "mean_y", "cxx", "cxy", "cyy"):
        a, b = getattr(f32, name), getattr(f64, name)
        err = float((a - b).abs().max() / b.abs().max())
        assert err < 1e-6, (name, err)
    # per diagonal entry too (the small-scale dims are not lost under the large ones)
    d32, d64 = f32.cxx.diagonal(), f64.cxx.diagonal()
    assert float(((d32 - d64).abs() / d64).max()) < 1e-5
    # the row-index path, merge and persistence read the mirrored matrix
    half = MomentStats(p, q, gram_dtype="float32").update(x, y, rows=torch.arange(0, n, 2))
    other = MomentStats(p, q, gram_dtype="float32").update(x, y, rows=torch.arange(1, n, 2))
    merged = half.merge(other)
    assert float((merged.cxx - f64.cxx).abs().max() / f64.cxx.abs().max()) < 1e-6
    again = MomentStats(p, q, gram_dtype="float32").load_state_dict(merged.state_dict())
    assert torch.equal(again.cxx, merged.cxx)


def test_float32_gram_is_only_for_full_unweighted_statistics():
    x, y = _data(n=300, p=8, q=3)
    w = torch.rand(300, generator=torch.Generator().manual_seed(2))
    for kw in ({"xx_block": 4}, {}):
        a = MomentStats(8, 3, gram_dtype="float32", **kw)
        b = MomentStats(8, 3, gram_dtype="float64", **kw)
        if kw:  # block-diagonal: float64 whatever the option
            a.update(x, y)
            b.update(x, y)
            assert a.chunk_rows() == b.chunk_rows() and torch.equal(a.cxx, b.cxx)
        else:  # weighted: float64 (the same arithmetic as the float64 object)
            a.update(x, y, weights=w)
            b.update(x, y, weights=w)
            assert torch.equal(a.cxx, b.cxx) and torch.equal(a.cxy, b.cxy)
    try:
        MomentStats(2, 2, gram_dtype="float16")
    except ValueError as exc:
        assert "gram_dtype" in str(exc) and "float32" in str(exc)
    else:
        raise AssertionError("float16 accepted")


def test_training_r2_closed_form_equals_the_explicit_sse():
    """select.train_r2 (no held-out split): cyy - Σ W⊙Cxy - λ Σ W² equals grouped_r2 on the training
    statistics (the second Cxx W GEMM) to float64 rounding."""
    from kvbridge.fit.select import train_r2
    from kvbridge.fit.solve import grouped_r2, solve

    x, y = _data(n=500, p=12, q=8, shift=5.0)
    st = MomentStats(12, 8).update(x, y)
    m = st.moments()
    for lam in (1e-3, 0.01, 10.0):
        w, b = solve(m, lam)
        closed, explicit = train_r2(w, m, lam, 4), grouped_r2(w, b, m, 4)
        assert torch.allclose(closed, explicit, rtol=0, atol=1e-10), (lam, closed, explicit)
        assert float(closed.min()) < 1.0  # a real fit, not a saturated one


def test_float32_gram_systems_are_read_from_the_upper_triangle_without_mirroring():
    """A solve's ``Cxx`` sub-matrix (any rows, in any order) of float32-Gram statistics is gathered from
    the upper triangle element by element: bitwise the matrix the mirror would give, and the full
    ``p x p`` lower triangle is never mirrored for it. Float64 statistics give exactly their own entries."""
    from kvbridge.fit.plan import GRAM_STRIP

    g = torch.Generator().manual_seed(5)
    n, p, q = 700, GRAM_STRIP + 96, 8  # two strips: rows from both, unordered
    x = torch.randn(n, p, generator=g)
    y = torch.randn(n, q, generator=g)
    rows = torch.cat([torch.arange(GRAM_STRIP + 32, GRAM_STRIP + 64), torch.arange(40, 72), torch.arange(500, 530)])
    cols = torch.tensor([5, 1])
    st = MomentStats(p, q, gram_dtype="float32").update(x, y)
    assert st._lower_stale
    got = st.moments(rows, cols)  # three runs of consecutive rows: block copies
    scattered = torch.arange(GRAM_STRIP + 90, 0, -37)  # one run per row: the element gather
    other = st.moments(scattered)
    sl = st.moments(slice(480, GRAM_STRIP + 40))  # a slice across the strip boundary
    assert st._lower_stale  # nothing was mirrored
    ref = st.cxx  # mirrors now (the upper triangle wins)
    assert torch.equal(got.cxx, ref[rows][:, rows]) and torch.equal(got.cxx, got.cxx.T)
    assert torch.equal(other.cxx, ref[scattered][:, scattered])
    assert torch.equal(sl.cxx, ref[480 : GRAM_STRIP + 40, 480 : GRAM_STRIP + 40])
    assert torch.equal(got.cxy, st.cxy[rows][:, cols]) and torch.equal(got.mean_x, st.mean_x[rows])
    # the raw lower triangle really differs from the upper one somewhere (float32 GEMM rounding), so reading
    # it unmirrored would have changed the solve: a fresh object, compared before any mirror
    raw = MomentStats(p, q, gram_dtype="float32").update(x, y)._xx()
    assert not torch.equal(raw, raw.T)
    f64 = MomentStats(p, q, gram_dtype="float64").update(x.double(), y.double())
    for r in (rows, scattered):
        assert torch.equal(f64.moments(r, cols).cxx, f64.cxx[r][:, r])


def test_statistics_of_a_split_without_observations_hold_no_memory():
    """No held-out rows: the held-out statistics never allocate their co-moments (a fit without a held-out
    split touches half the memory); read, they are zeros of the right shape."""
    g = torch.Generator().manual_seed(2)
    dims = dict(src_heads=2, src_dim=4, tgt_heads=1, tgt_dim=3)
    job = LayerStats(range(3), range(2), **dims, gram_dtype="float32")
    n = 50
    feats = {
        "xk": torch.randn(n, 3, 2, 4, generator=g),
        "xv": torch.randn(n, 3, 2, 4, generator=g),
        "yk": torch.randn(n, 2, 1, 3, generator=g),
        "yv": torch.randn(n, 2, 1, 3, generator=g),
    }
    job.update(feats, torch.zeros(n, dtype=torch.bool))
    for c in ("k", "v"):
        held, train = job.stats[(c, "held")], job.stats[(c, "train")]
        assert held.n == 0 and held._cxx is None and held._cxy is None
        assert train._cxx is not None and train._cxy is not None
        m = job.moments(c, "held", src_layers=[2, 0], tgt_layers=[1])
        assert m.cxx.shape == (16, 16) and not m.cxx.any() and m.cxy.shape == (16, 3) and not m.cxy.any()
    assert job.nbytes() == 4 * MomentStats.nbytes_for(24, 6)  # the memory model counts both splits (a bound)


def test_mirror_upper_copies_the_upper_triangle_down_across_strips():
    from kvbridge.fit.plan import GRAM_STRIP
    from kvbridge.fit.stats import mirror_upper

    g = torch.Generator().manual_seed(0)
    for n in (1, GRAM_STRIP, GRAM_STRIP + 1, 2 * GRAM_STRIP + 7):
        sub = torch.randn(n + 5, n + 5, generator=g, dtype=torch.float64)[3 : 3 + n, 3 : 3 + n]
        out = mirror_upper(sub.clone())
        assert torch.equal(out, sub.triu() + sub.triu(1).mT) and torch.equal(out, out.mT), n
