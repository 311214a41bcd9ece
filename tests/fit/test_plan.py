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
    code = ("import sys, kvbridge.fit as F; p = F.plan('zoo:base', 'zoo:wide', device_flops=1e12); "
            "assert p.seconds > 0 and p.lines(); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert callable(plan_mod) and plan_mod("zoo:base", "zoo:base").passes


@pytest.mark.parametrize("xx_block", ["full", "layer", "head"])
def test_statistics_bytes_equal_the_fitters_objects(xx_block):
    from kvbridge.fit.stats import LayerStats

    s, t = model_size(PAIR[0]), model_size(PAIR[1])
    dims = dict(src_heads=s.kv_heads, src_dim=s.head_dim, tgt_heads=t.kv_heads, tgt_dim=t.head_dim)
    job = LayerStats(range(s.layers), range(t.layers), **dims, xx_block=xx_block)  # real float64 tensors
    real = sum(m.cxx.nbytes + m.cxy.nbytes + m.mean_x.nbytes + m.mean_y.nbytes + m.cyy.nbytes
               for m in job.all_stats())
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
    budget = LayerStats.nbytes_for(s.layers, t.layers, **dims) // 3
    p = plan(*PAIR, memory_budget=budget, top_k=2)
    sel = plan_blocks(t.layers, lambda b: LayerStats.nbytes_for(s.layers, len(b), **dims, xx_block="layer"),
                      budget, what="selection")
    planned_sel = [ps for ps in p.passes if ps.tag.startswith("select")]
    assert [ps.target_layers for ps in planned_sel] == [(b[0], b[-1]) for b in sel]
    assert all(ps.statistics_bytes <= budget for ps in p.passes) and p.worst_case
    assert any(ps.tag.startswith("fit") for ps in p.passes)
    assert "blocking plan" in "\n".join(p.lines())
    with pytest.raises(Exception, match="over the 1000 B budget"):
        plan(*PAIR, memory_budget=1000)


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
        layers.append(LayerMap("dense" if fitter == "ridge" else "headwise", sources, torch.randn(w), torch.randn(b),
                               torch.randn(w), torch.randn(b)))
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

    res = CliRunner().invoke(cli, ["fit", *PAIR, "--plan", "--device-flops", "1e11", "--memory", "0.002", "--top-k", "2"])
    assert res.exit_code == 0, res.output
    assert "statistics memory" in res.output and "time at 1e+11 FLOP/s" in res.output
    assert "blocking plan" in res.output
