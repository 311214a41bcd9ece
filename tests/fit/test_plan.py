"""The resource planner (kvbridge.fit.plan) against what a fit really allocates and writes (zoo models)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from kvbridge.fit import plan as plan_mod
from kvbridge.fit.plan import layer_stats_bytes, model_size, plan

PAIR = ("zoo:base", "zoo:wide")


def test_plan_is_torch_free_and_the_module_is_callable():
    code = (
        "import sys, kvbridge.fit as F; p = F.plan('zoo:base', 'zoo:wide', device_flops=1e12); "
        "assert p.seconds > 0 and p.lines(); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert callable(plan_mod) and plan_mod("zoo:base", "zoo:base").passes


@pytest.mark.parametrize("xx_block", ["full", "layer", "head"])
def test_statistics_bytes_equal_the_fitters_objects(xx_block):
    from kvbridge.fit.stats import LayerStats

    s, t = model_size(PAIR[0]), model_size(PAIR[1])
    dims = dict(src_heads=s.kv_heads, src_dim=s.head_dim, tgt_heads=t.kv_heads, tgt_dim=t.head_dim)
    job = LayerStats(range(s.layers), range(t.layers), **dims, xx_block=xx_block)  # real float64 tensors
    real = sum(m.cxx.nbytes + m.cxy.nbytes + m.mean_x.nbytes + m.mean_y.nbytes + m.cyy.nbytes for m in job.all_stats())
    planned = layer_stats_bytes(s.layers, t.layers, s.kv_features, s.head_dim, t.kv_features, xx_block)
    assert planned == job.nbytes()  # the fitters' own memory model, which their blocking uses
    assert 0 <= planned - real <= 0.005 * real  # and the tensors they really hold
    if xx_block == "full":
        assert plan(*PAIR).statistics_bytes == planned  # fits the default budget: one joint pass


def test_blocking_plan_follows_the_fitters_rule():
    from kvbridge.fit.ridge import plan_blocks
    from kvbridge.fit.stats import LayerStats

    s, t = model_size(PAIR[0]), model_size(PAIR[1])
    dims = dict(src_heads=s.kv_heads, src_dim=s.head_dim, tgt_heads=t.kv_heads, tgt_dim=t.head_dim)
    budget = LayerStats.job_bytes_for(s.layers, t.layers, **dims) // 3  # statistics + workspace: the rule
    p = plan(*PAIR, memory_budget=budget, top_k=2)
    sel = plan_blocks(
        t.layers,
        lambda b: LayerStats.job_bytes_for(s.layers, len(b), **dims, xx_block="layer"),
        budget,
        what="selection",
    )
    planned_sel = [ps for ps in p.passes if ps.tag.startswith("select")]
    assert [ps.target_layers for ps in planned_sel] == [(b[0], b[-1]) for b in sel]
    assert all(ps.statistics_bytes <= budget for ps in p.passes) and p.worst_case
    assert any(ps.tag.startswith("fit") for ps in p.passes)
    assert "blocking plan" in "\n".join(p.lines())
    with pytest.raises(Exception, match="over the 1000 B budget"):
        plan(*PAIR, memory_budget=1000)


@pytest.mark.parametrize("fitter, top_k", [("ridge", 4), ("ridge", 1), ("ridge-headwise", 4)])
def test_the_smallest_workable_budget_is_named_and_works(fitter, top_k):
    from kvbridge.errors import ConfigError
    from kvbridge.fit.plan import minimum_budget
    from kvbridge.sizes import GIB

    s, t = model_size(PAIR[0]), model_size(PAIR[1])
    least = minimum_budget(fitter, s.layers, t.layers, s.kv_features, s.head_dim, t.kv_features, top_k)
    p = plan(*PAIR, fitter=fitter, top_k=top_k, memory_budget=least)  # exactly the minimum: a (blocked) plan
    assert p.passes and all(ps.statistics_bytes <= least for ps in p.passes)
    with pytest.raises(ConfigError) as err:
        plan(*PAIR, fitter=fitter, top_k=top_k, memory_budget=least - 1)
    text = str(err.value)
    assert "0.00 GiB" not in text and "MiB budget" in text  # sizes in a unit that shows them
    flag = text.split("pass --memory ")[1].split()[0]
    assert int(float(flag) * GIB) >= least  # passing the named value is enough ...
    plan(*PAIR, fitter=fitter, top_k=top_k, memory_budget=int(float(flag) * GIB))  # ... and plans
    # the budget a small zoo fit ran in before the workspace joined the blocking rule: refused, naming the minimum
    if fitter == "ridge" and top_k == 4:
        with pytest.raises(ConfigError, match=r"over the 1\.23 MiB budget .*pass --memory 0\.00"):
            plan(*PAIR, fitter=fitter, top_k=top_k, memory_budget=int(0.0012 * GIB))


@pytest.mark.parametrize("fitter", ["ridge", "ridge-headwise"])
def test_artifact_bytes_equal_the_written_file(tmp_path, fitter):
    from safetensors.torch import save_file

    from kvbridge.fit.mapping import FittedMapping, LayerMap
    from kvbridge.models import resolve

    src, tgt = (resolve(r).spec() for r in PAIR)
    p = plan(*PAIR, fitter=fitter, top_k=3)
    fs, ft = src.num_kv_heads * src.head_dim, tgt.num_kv_heads * tgt.head_dim
    layers = []
    for t in range(tgt.num_layers):
        if fitter == "ridge":
            w, b, sources = (3 * fs, ft), (ft,), (0, 1, 2)
        else:
            w, b = (tgt.num_kv_heads, src.head_dim, tgt.head_dim), (tgt.num_kv_heads, tgt.head_dim)
            sources = tuple((0, h % src.num_kv_heads) for h in range(tgt.num_kv_heads))
        layers.append(
            LayerMap(
                "dense" if fitter == "ridge" else "headwise",
                sources,
                torch.randn(w),
                torch.randn(b),
                torch.randn(w),
                torch.randn(b),
            )
        )
    mapping = FittedMapping(src, tgt, layers)
    path = tmp_path / "mapping.safetensors"
    save_file({k: v.contiguous() for k, v in mapping.tensors().items()}, str(path))  # as write_artifact does
    assert p.artifact_bytes == path.stat().st_size


def test_parameter_count_matches_the_built_model():
    from kvbridge.models import load

    for ref in PAIR:
        model = load(ref, dtype="float32").model
        real = sum(t.numel() for t in model.parameters())
        assert abs(model_size(ref).params - real) / real < 0.02, ref  # norms are left out


def test_cli_plan_needs_no_corpus():
    from click.testing import CliRunner

    from kvbridge.cli.main import cli

    res = CliRunner().invoke(
        cli, ["fit", *PAIR, "--plan", "--device-flops", "1e11", "--memory", "0.003", "--top-k", "2"]
    )
    assert res.exit_code == 0, res.output
    assert "statistics memory" in res.output and "time at 1e+11 FLOP/s" in res.output
    assert "blocking plan" in res.output


def _rates(**kw):
    from kvbridge.fit.plan_rates import PlanRates

    base = dict(source_forward=1e10, target_forward=2e10, gemm64=3e9, solve64=1e9, memory=4e9, hash=5e8)
    return PlanRates(**{**base, **kw})


def test_time_is_the_sum_of_its_parts_at_the_rates():
    r = _rates()
    p = plan(*PAIR, tokens=8192, stride=2, top_k=2, rates=r)
    parts = p.time_parts()
    s, t = model_size(PAIR[0]), model_size(PAIR[1])
    assert parts["source forwards"] == pytest.approx(s.forward_flops(8192, 512) / 1e10)
    assert parts["target forwards"] == pytest.approx(t.forward_flops(8192, 512) / 2e10)
    assert parts["statistics"] == pytest.approx(p.statistics_flops / 3e9)
    assert parts["solves"] == pytest.approx(p.solve_flops / 1e9)
    assert parts["memory"] == pytest.approx(p.statistics_bytes / 4e9)  # one pass: the statistics zero-filled
    assert parts["fingerprints"] == pytest.approx(p.hash_bytes / 5e8)
    assert p.seconds == pytest.approx(sum(parts.values()))
    # each part scales with its own rate only
    q = plan(*PAIR, tokens=8192, stride=2, top_k=2, rates=_rates(gemm64=6e9))
    assert q.time_parts()["statistics"] == pytest.approx(parts["statistics"] / 2)
    assert q.time_parts()["source forwards"] == parts["source forwards"]
    text = "\n".join(p.lines())
    assert "time at the rates measured on cpu" in text and "fingerprints" in text
    assert p.to_dict()["time_parts"] == parts and p.to_dict()["rates"]["gemm64"] == 3e9
    # without rates: the FLOP bound, as before
    assert plan(*PAIR).time_parts() is None and plan(*PAIR).seconds is None


def test_passes_multiply_the_forwards_and_the_memory_traffic():
    from kvbridge.fit.stats import LayerStats

    s, t = model_size(PAIR[0]), model_size(PAIR[1])
    dims = dict(src_heads=s.kv_heads, src_dim=s.head_dim, tgt_heads=t.kv_heads, tgt_dim=t.head_dim)
    one = plan(*PAIR, top_k=2, rates=_rates())
    many = plan(*PAIR, top_k=2, rates=_rates(), memory_budget=LayerStats.job_bytes_for(s.layers, t.layers, **dims) // 3)
    assert len(many.passes) > 1
    assert many.forward_flops == pytest.approx(len(many.passes) * one.forward_flops)
    assert many.memory_traffic_bytes == sum(p.statistics_bytes for p in many.passes)


def test_fingerprint_bytes_are_the_state_dict_bytes():
    from kvbridge.models import load

    p = plan(*PAIR)
    real = sum(
        t.numel() * t.element_size() for ref in PAIR for t in load(ref, dtype="float32").model.state_dict().values()
    )
    assert abs(p.hash_bytes - real) / real < 0.02  # norms are left out


def test_measured_rates_are_positive_and_cover_every_part():
    import math

    from kvbridge.fit.plan_rates import measure_rates

    r = measure_rates("zoo:base", "zoo:wide", seq_len=32, batch_size=1, stride=4, top_k=2)
    for name in ("source_forward", "target_forward", "gemm64", "gemm32", "solve64", "memory", "hash"):
        assert math.isfinite(getattr(r, name)) and getattr(r, name) > 0, name
    assert r.device == "cpu" and r.threads >= 1
    p = plan("zoo:base", "zoo:wide", tokens=4096, rates=r)
    assert all(v > 0 for v in p.time_parts().values())


def test_the_fitters_own_refusal_shows_sizes_and_the_largest_layer():
    from kvbridge.fit.solve import FitError, plan_blocks
    from kvbridge.sizes import fmt_size, gib_flag

    need = [1000, 3_000_000, 2_000_000]  # bytes of one target layer each; the second is the largest
    with pytest.raises(FitError) as err:
        plan_blocks(3, lambda b: sum(need[i] for i in b), 2_500_000, what="layer selection")
    text = str(err.value)
    assert f"needs at least {fmt_size(3_000_000)}" in text and f"over the {fmt_size(2_500_000)} budget" in text
    assert f"--memory {gib_flag(3_000_000)}" in text and "0.00 GiB" not in text
    assert plan_blocks(3, lambda b: sum(need[i] for i in b), 3_000_000, what="layer selection") == [[0], [1], [2]]


def test_plan_states_the_attention_recording_and_the_weighted_pass():
    from kvbridge.fit.plan import attention_record_bytes, plan, workspace_bytes

    plain = plan("zoo:base", "zoo:wide", tokens=4096, seq_len=256)
    weighted = plan("zoo:base", "zoo:wide", tokens=4096, seq_len=256, support="head-local", weighting="attention")
    assert len(weighted.passes) == len(plain.passes) + 1 and weighted.passes[-1].tag == "heads-weighted"
    rec = attention_record_bytes(4, 256, q_heads=6, kv_heads=2, head_dim=32, layers=6)
    # statistics + workspace is the larger pass's: the joint pass (a float32 workspace) or the weighted
    # per-head pass (a float64 one), + the recording
    s, t = weighted.source, weighted.target
    rows = 4 * len(range(0, 256, 4))  # --batch-size 4 x the kept positions of one sequence (stride 4)
    weighted_ws = workspace_bytes(s.layers * s.kv_features, t.layers * t.kv_features, rows, "float64")
    held = max(plain.statistics_bytes + plain.batch_buffer_bytes, weighted.passes[-1].statistics_bytes + weighted_ws)
    assert weighted.statistics_bytes + weighted.batch_buffer_bytes == held + rec
    assert any("recording the target's boundary queries" in n for n in weighted.notes)


def test_plan_counts_the_held_out_statistics_only_when_sequences_are_held_out():
    from kvbridge.fit.plan import layer_stats_bytes, plan

    kw = dict(tokens=2048, seq_len=512, stride=2, top_k=2)
    held, alone = plan("zoo:base", "zoo:stranger", **kw), plan("zoo:base", "zoo:stranger", heldout=0.0, **kw)
    assert alone.statistics_bytes * 2 == held.statistics_bytes
    assert layer_stats_bytes(4, 4, 64, 32, 64, splits=1) * 2 == layer_stats_bytes(4, 4, 64, 32, 64)
    one_sequence = plan("zoo:base", "zoo:stranger", tokens=512, seq_len=512, stride=2, top_k=2)  # nothing to hold out
    assert one_sequence.statistics_bytes == alone.statistics_bytes


def test_without_a_held_out_split_the_smallest_budget_counts_the_train_split_only():
    """--heldout 0: the held-out statistics stay empty, so the minimum is the one-split one: a budget
    the two-split minimum refuses plans, and the refusal with a held-out share names the larger one."""
    from kvbridge.errors import ConfigError
    from kvbridge.fit.plan import minimum_budget

    s, t = model_size(PAIR[0]), model_size(PAIR[1])
    one, two = (
        minimum_budget("ridge", s.layers, t.layers, s.kv_features, s.head_dim, t.kv_features, 2, splits)
        for splits in (1, 2)
    )
    assert one < two
    alone = plan(*PAIR, top_k=2, heldout=0.0, memory_budget=one)
    assert alone.passes and all(ps.statistics_bytes <= one for ps in alone.passes)
    with pytest.raises(ConfigError, match="over the .* budget"):
        plan(*PAIR, top_k=2, memory_budget=one)


def test_plan_counts_one_calibration_batch_beside_the_statistics():
    from kvbridge.fit.plan import calibration_batch_bytes, forward_activation_bytes, model_size, plan

    p4 = plan("zoo:base", "zoo:stranger", tokens=2048, seq_len=512, stride=2, top_k=2)
    p1 = plan("zoo:base", "zoo:stranger", tokens=2048, seq_len=512, stride=2, top_k=2, batch_size=1)
    s, t = model_size("zoo:base"), model_size("zoo:stranger")
    assert s.hidden == 128 and s.intermediate == 256 and s.gated_mlp
    # 4 sequences of 512 tokens, 256 kept each: the target's forward (activations + its K/V) beside the source's rows
    kv = 2 * t.layers * 2048 * t.kv_features * 4
    rows_src = 2 * 1024 * s.layers * s.kv_features * 4
    assert forward_activation_bytes(t, 2048, 4) == 2048 * (3 * 128 + 3 * 256) * 4
    assert p4.calibration_bytes == rows_src + forward_activation_bytes(t, 2048, 4) + kv
    assert p4.calibration_bytes == calibration_batch_bytes(s, t, batch=4, seq_len=512, rows=1024, dtype_bytes=4)
    assert p1.calibration_bytes * 4 == p4.calibration_bytes  # every phase scales with the batch
    assert p4.fit_bytes == p4.statistics_bytes + p4.batch_buffer_bytes + p4.calibration_bytes
    assert p4.peak_bytes == p4.fit_bytes + p4.weights_bytes
    text = "\n".join(p4.lines())
    # 21.34 MiB = 21.03 MiB with the float64 workspace + 0.31 MiB: the default float32 Gram's product strip
    # (4 bytes x 256 x 256) and the float64 cast of 32 of its rows per add (8 x 32 x 256) beside the
    # same-size chunk
    assert "calibration batch 15.00 MiB (4 x 512 tokens" in text and "fit memory ~21.34 MiB" in text
    f64 = plan("zoo:base", "zoo:stranger", tokens=2048, seq_len=512, stride=2, top_k=2, gram_dtype="float64")
    assert "fit memory ~21.03 MiB" in "\n".join(f64.lines())
    # a bfloat16 load halves the caches and activations, not the float32 rows
    half = plan("zoo:base", "zoo:stranger", tokens=2048, seq_len=512, stride=2, top_k=2, dtype="bfloat16")
    assert half.calibration_bytes == rows_src + (forward_activation_bytes(t, 2048, 4) + kv) // 2


def test_a_budget_the_batch_pushes_over_says_the_memory_flag_that_stays_within():
    import re

    from kvbridge.fit.plan import plan

    kw = dict(tokens=2048, seq_len=512, stride=2, top_k=2)
    assert not any("--memory bounds" in n for n in plan("zoo:base", "zoo:stranger", memory_budget=30 << 20, **kw).notes)
    over = plan("zoo:base", "zoo:stranger", memory_budget=20 << 20, **kw)
    assert over.fit_bytes > 20 << 20
    note = next(n for n in over.notes if "--memory bounds" in n)
    flag = float(re.search(r"pass --memory ([0-9.]+) \(more passes\)", note).group(1))
    within = plan("zoo:base", "zoo:stranger", memory_budget=int(flag * 2**30), **kw)
    assert within.fit_bytes <= 20 << 20 and len(within.passes) > len(over.passes)
    # a budget the batch alone fills: the smallest budget and a smaller batch
    from kvbridge.fit.plan import minimum_budget, model_size
    from kvbridge.sizes import gib_flag

    tiny = plan("zoo:base", "zoo:stranger", memory_budget=8 << 20, **kw)
    s = model_size("zoo:base")
    lowest = gib_flag(minimum_budget("ridge", 4, 4, s.kv_features, s.head_dim, s.kv_features, 2))
    assert any(f"pass the smallest --memory ({lowest}) and a smaller --batch-size" in n for n in tiny.notes)


def test_statistics_time_uses_the_rate_of_the_gram_dtype_the_fit_runs():
    """The default fit accumulates its full co-moments from float32 GEMMs: the plan times them at the
    float32-Gram rate (``gemm32``), a float64 fit (and block-diagonal passes) at ``gemm64``."""
    r = _rates(gemm32=9e9)  # three times the float64 rate
    f32 = plan(*PAIR, tokens=8192, stride=2, top_k=2, rates=r)
    f64 = plan(*PAIR, tokens=8192, stride=2, top_k=2, rates=r, gram_dtype="float64")
    assert f32.statistics_flops == f64.statistics_flops > 0
    assert f32.statistics_flops32 == f32.statistics_flops and f64.statistics_flops32 == 0  # one joint full pass
    assert f32.time_parts()["statistics"] == pytest.approx(f32.statistics_flops / 9e9)
    assert f64.time_parts()["statistics"] == pytest.approx(f64.statistics_flops / 3e9)
    text = "\n".join(f32.lines())
    assert "float32 Gram 9e+09" in text and "(float32 Gram)" in text
    # blocked: the block-diagonal selection passes run in float64, the fit passes in float32
    s, t = model_size(PAIR[0]), model_size(PAIR[1])
    dims = dict(src_heads=s.kv_heads, src_dim=s.head_dim, tgt_heads=t.kv_heads, tgt_dim=t.head_dim)
    from kvbridge.fit.stats import LayerStats

    budget = LayerStats.job_bytes_for(s.layers, t.layers, **dims) // 3
    blocked = plan(*PAIR, tokens=8192, stride=2, top_k=2, rates=r, memory_budget=budget)
    sel = sum(p.statistics_flops for p in blocked.passes if p.tag.startswith("select"))
    assert 0 < sel < blocked.statistics_flops and blocked.statistics_flops32 == pytest.approx(
        blocked.statistics_flops - sel
    )
    assert blocked.time_parts()["statistics"] == pytest.approx(sel / 3e9 + blocked.statistics_flops32 / 9e9)
    # rates measured without a float32 rate: the float64 one, as before
    assert plan(*PAIR, tokens=8192, stride=2, top_k=2, rates=_rates()).time_parts()["statistics"] == pytest.approx(
        f32.statistics_flops / 3e9
    )
    # the peak-rate bound: the float32 Gram at the float32 peak, the rest at the float64 one
    peak = plan(*PAIR, tokens=8192, stride=2, top_k=2, device_flops=4e10, device_flops64=1e10)
    assert peak.seconds == pytest.approx(
        peak.forward_flops / 4e10 + peak.statistics_flops / 4e10 + peak.solve_flops / 1e10
    )
