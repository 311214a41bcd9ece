"""Distributed fitting (2 gloo processes == 1 process) and --resume from checkpointed statistics."""

from __future__ import annotations

import pytest
import torch

from kvbridge.fit.distributed import CheckpointError, default_checkpoint_dir

_SHARED: dict = {}


def _worker(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from kvbridge.fit import fit
    from kvbridge.fit.distributed import setup

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        ctx = setup()
        assert ctx is not None and ctx.world == world
        p = _SHARED["planted"]
        fit(
            p["source"],
            p["target"],
            p["ids"],
            top_k=2,
            stride=2,
            host=_SHARED["host"],
            distributed=ctx,
            out=out,
            gram_dtype=_SHARED.get("gram_dtype", "float32"),
        )
    finally:
        dist.destroy_process_group()


def _max_diff(a, b) -> float:
    worst = 0.0
    for x, y in zip(a.layers, b.layers):
        assert x.sources == y.sources
        for name in ("wk", "bk", "wv", "bv"):
            worst = max(worst, float((getattr(x, name) - getattr(y, name)).abs().max()))
    return worst


def test_two_gloo_processes_give_the_single_process_mapping(planted, fit_host, tmp_path):
    """The all-reduce is exact algebra (Chan's merge about a shared centre): checked in float64
    statistics (-o gram_dtype=float64) to 1e-6. (With the default float32 Gram the two processes'
    chunks differ from one process's, so their float32 products round differently: ~1e-6 relative,
    what tests/fit/test_stats.py bounds for the float32 path itself.)"""
    import torch.multiprocessing as mp

    from kvbridge.fit import fit, load_mapping

    planted_fit = fit(
        planted["source"],
        planted["target"],
        planted["ids"],
        top_k=2,
        stride=2,
        host=fit_host,
        distributed=None,
        gram_dtype="float64",
    )
    _SHARED.update(planted=planted, host=fit_host, gram_dtype="float64")
    out = tmp_path / "dist"
    # fork: the children inherit the imported modules and the models (no re-import under load)
    mp.start_processes(_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True, start_method="fork")
    got = load_mapping(out, source=planted["source"], target=planted["target"])
    assert got.manifest["calibration"]["world_size"] == 2
    diff = _max_diff(got, planted_fit)
    print(f"2-process vs 1-process mapping: max |dW| {diff:.2e}")
    assert diff <= 1e-6
    r2a, r2b = torch.tensor(got.manifest["heldout_r2"]["v"]), torch.tensor(planted_fit.report.heldout_r2["v"])
    assert float((r2a - r2b).abs().max()) <= 1e-6
    assert not default_checkpoint_dir(out).exists()


class Interrupted(Exception):
    pass


def test_resume_continues_an_interrupted_fit(planted, planted_fit, fit_host, tmp_path):
    from kvbridge.fit import fit

    out = tmp_path / "m"
    seen = []

    def stop_after_three(event):
        if event[0] == "advance":
            seen.append(event)
            if len(seen) == 3:
                raise Interrupted

    kw = dict(top_k=2, stride=2, host=fit_host, distributed=None, out=out, checkpoint_every=0)
    with pytest.raises(Interrupted):  # checkpoints are kept only when --resume asks for them
        fit(planted["source"], planted["target"], planted["ids"], progress=stop_after_three, resume=True, **kw)
    assert not out.exists()
    ck = default_checkpoint_dir(out)
    assert list(ck.glob("joint.rank0of1.safetensors"))

    with pytest.raises(CheckpointError, match="calibration"):
        fit(planted["source"], planted["target"], planted["ids"], resume=True, **{**kw, "stride": 3})

    events = []
    mapping = fit(planted["source"], planted["target"], planted["ids"], resume=True, progress=events.append, **kw)
    batches = sum(1 for e in events if e[0] == "advance")
    assert batches == 10 - 3  # 40 sequences / batch 4 = 10 batches, 3 were done
    assert _max_diff(mapping, planted_fit) <= 1e-9
    assert out.exists() and not ck.exists()


def test_resume_continues_an_interrupted_attention_weighted_pass(planted, fit_host, tmp_path):
    """The weighted per-head pass (ridge -o weighting=attention) checkpoints and resumes like the joint one."""
    from kvbridge.fit import fit

    opts = {"top_k": 1, "support": "head-local", "weighting": "attention"}
    kw = dict(stride=2, host=fit_host, distributed=None, checkpoint_every=0, options=opts)
    whole = fit(planted["source"], planted["target"], planted["ids"], **kw)
    out = tmp_path / "w"
    seen = []

    def stop_in_the_weighted_pass(event):
        if event[0] == "advance" and event[1] == "heads-weighted":
            seen.append(event)
            if len(seen) == 2:
                raise Interrupted

    with pytest.raises(Interrupted):
        fit(
            planted["source"],
            planted["target"],
            planted["ids"],
            out=out,
            resume=True,
            progress=stop_in_the_weighted_pass,
            **kw,
        )
    assert list(default_checkpoint_dir(out).glob("heads-weighted.rank0of1.safetensors"))
    events = []
    mapping = fit(
        planted["source"], planted["target"], planted["ids"], out=out, resume=True, progress=events.append, **kw
    )
    assert sum(1 for e in events if e[0] == "advance" and e[1] == "heads-weighted") == 10 - 2
    assert _max_diff(mapping, whole) <= 1e-9
