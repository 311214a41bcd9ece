"""Paired calibration features: what they hold, and what a batch keeps alive while it is built."""

from __future__ import annotations

import weakref

import torch

from kvbridge.fit.calibrate import CalibrationConfig, PairedCalibration


def _reference(cal, model, adapter, spec, ids, seq_idx):
    """``[n, L, H, D]`` of the kept positions, straight from the model's stripped cache (one sequence at a
    time through the same batch forward)."""
    state = adapter.extract(model, ids, spec=spec).strip_rope(host=cal.host)
    rows = {"k": [], "v": []}
    for b, i in enumerate(seq_idx):
        pos = cal.positions_of(i)
        for name, layers in (("k", state.keys), ("v", state.values)):
            rows[name].append(torch.stack([t[b][:, pos] for t in layers]).permute(2, 0, 1, 3).float())
    return {name: torch.cat(r) for name, r in rows.items()}


def test_features_are_the_kept_positions_of_both_stripped_caches(planted, fit_host):
    # stride 3 with skip 1: sequences keep different numbers of positions; a held-out sequence in the batch
    cfg = CalibrationConfig(stride=3, skip=1, heldout=0.25, seed=3, batch_size=4)
    cal = PairedCalibration(planted["source"], planted["target"], planted["ids"][:8], cfg, host=fit_host)
    seq_idx = cal.batches()[0]
    assert len({len(cal.positions_of(i)) for i in range(8)}) > 1  # ragged: the case a fixed layout would get wrong
    feats, held = cal.features(seq_idx)
    order = sorted(seq_idx, key=lambda i: bool(cal.held[i]))
    ids = cal.sequences[order]
    src = _reference(cal, cal.source_model, cal.source_adapter, cal.source_spec, ids, order)
    tgt = _reference(cal, cal.target_model, cal.target_adapter, cal.target_spec, ids, order)
    for name, ref in (("xk", src["k"]), ("xv", src["v"]), ("yk", tgt["k"]), ("yv", tgt["v"])):
        assert feats[name].dtype == torch.float32 and feats[name].is_contiguous()
        assert torch.equal(feats[name], ref), name
    want = torch.cat([torch.full((len(cal.positions_of(i)),), bool(cal.held[i])) for i in order])
    assert torch.equal(held, want) and bool(held.any()) and not bool(held.all())


def test_the_source_cache_is_dropped_before_the_target_forward(planted, fit_host):
    cal = PairedCalibration(
        planted["source"], planted["target"], planted["ids"][:4], CalibrationConfig(stride=2), host=fit_host
    )
    content = cal._content
    alive_at_target = []
    source_refs = []

    def watched(model, adapter, spec, ids):
        if model is cal.target_model:
            alive_at_target.append(sum(r() is not None for r in source_refs))
        k, v = content(model, adapter, spec, ids)
        if model is cal.source_model:
            source_refs.extend(weakref.ref(t) for t in list(k) + list(v))
        return k, v

    cal._content = watched
    feats, _ = cal.features(cal.batches()[0])
    assert source_refs and alive_at_target == [0]  # only the sampled rows of the source cross the target's forward
    assert feats["xk"].shape[0] == feats["yk"].shape[0] > 0


def test_sampled_rows_are_the_bytes_the_plan_counts(planted, fit_host):
    from kvbridge.fit.plan import ModelSize, calibration_batch_bytes

    cfg = CalibrationConfig(stride=2, batch_size=4)
    cal = PairedCalibration(planted["source"], planted["target"], planted["ids"][:4], cfg, host=fit_host)
    feats, held = cal.features(cal.batches()[0])
    s, t = cal.source_spec, cal.target_spec
    rows = len(held)

    def size(spec):  # no forward activations, no cache: the plan's phases reduce to the sampled rows
        return ModelSize("m", spec.num_layers, spec.num_kv_heads, spec.head_dim, 0, 0, 0)

    sampled = calibration_batch_bytes(size(s), size(t), batch=0, seq_len=cal.seq_len, rows=rows, dtype_bytes=4)
    assert sampled == sum(v.nbytes for v in feats.values())
