"""The ``translator`` fitter: contract, determinism, resume, the artifact path, what it trains on."""

from __future__ import annotations

import pytest
import torch

from kvbridge.fit.calibrate import CalibrationConfig, PairedCalibration
from kvbridge.fit.protocol import build_options
from kvbridge.fit.solve import FitError
from kvbridge.fit.translator import TranslatorFitter, TranslatorOptions
from kvbridge.fit.translator_mapping import TranslatorMapping, rotate
from kvbridge.testing import FitterContract

#: small and fast: a few steps of a rank-4 residual on the planted pair
QUICK = {"top_k": 2, "steps": 3, "rank": 4, "lr": 1e-4, "queries": 16}


class TestTranslatorContract(FitterContract):
    fitter = TranslatorFitter
    options = QUICK


def _fit(planted, fit_host, *, out=None, fit_resume=False, **opts):
    from kvbridge.fit import fit

    return fit(
        planted["source"],
        planted["target"],
        planted["ids"],
        fitter="translator",
        options=opts,
        calibration=CalibrationConfig(stride=2, heldout=0.25),
        host=fit_host,
        distributed=None,
        out=out,
        **({"resume": True} if fit_resume else {}),
    )


#: a ridge that misses (strong shrinkage), so the residual has something to learn
MISFIT = {"top_k": 1, "alpha": 300.0, "steps": 8, "rank": 4, "lr": 1e-2, "queries": 0, "batch": 3}


@pytest.fixture(scope="module")
def trained(planted, fit_host, tmp_path_factory):
    out = tmp_path_factory.mktemp("translator") / "m"
    return _fit(planted, fit_host, out=out, **MISFIT), out


def _equal(a, b) -> bool:
    ta, tb = a.tensors(), b.tensors()
    return set(ta) == set(tb) and all(torch.equal(ta[n], tb[n]) for n in ta)


def test_training_lowers_the_attention_error_and_the_manifest_records_it(trained):
    mapping, _ = trained
    tr = mapping.report.training
    assert tr["after"]["train"]["loss"] < 0.95 * tr["before"]["train"]["loss"]
    assert tr["after"]["heldout"]["loss"] < tr["before"]["heldout"]["loss"]
    assert mapping.manifest["training"]["after"] == tr["after"]
    assert mapping.manifest["residual"] == {"kind": "lowrank", "size": 4, "space": "content"}
    assert mapping.manifest["mode"] == "dense+residual"  # a reader without the residual refuses the mode
    assert tr["steps"] == 8 and len(tr["curve"]) >= 2 and tr["seconds_per_step"] > 0


def test_two_runs_with_one_seed_give_bitwise_equal_artifacts(planted, fit_host, tmp_path, trained):
    import json

    a, a_dir = trained
    b = _fit(planted, fit_host, out=tmp_path / "b", **MISFIT)
    assert _equal(a, b)
    sha = [json.loads((d / "manifest.json").read_text())["tensor_sha256"] for d in (a_dir, tmp_path / "b")]
    assert sha[0] == sha[1]
    c = _fit(planted, fit_host, **{**MISFIT, "steps": 2, "seed": 1})
    d = _fit(planted, fit_host, **{**MISFIT, "steps": 2})
    assert not _equal(c, d)  # the seed matters (init and batches)


def test_an_interrupted_run_resumes_to_the_uninterrupted_result(planted, fit_host, tmp_path, monkeypatch, trained):
    from kvbridge import faults

    whole, _ = trained
    opts = {**MISFIT, "checkpoint_every": 2}
    state = tmp_path / "state"
    monkeypatch.setenv("KVBRIDGE_FAULT", "translator.step:5")  # dies after step 5 (checkpoint at 4)
    faults.reset()
    with pytest.raises(faults.InjectedFault):
        _fit(planted, fit_host, resume=str(state), **opts)
    monkeypatch.delenv("KVBRIDGE_FAULT")
    faults.reset()
    assert (state / "translator-state.safetensors").is_file()
    again = _fit(planted, fit_host, resume=str(state), **opts)
    assert again.report.training["resumed_at_step"] == 4
    assert _equal(whole, again)
    other = {**opts, "rank": 3}  # a state of another run is refused
    with pytest.raises(FitError, match="another translator run"):
        _fit(planted, fit_host, resume=str(state), **other)


def test_the_artifact_loads_as_a_translator_and_transfers_like_the_fitted_one(planted, fit_host, trained, tmp_path):
    from kvbridge.fit.artifact import load_mapping
    from kvbridge.testing.planted import token_ids
    from kvbridge.transfer import transfer

    mapping, folder = trained
    back = load_mapping(folder, source=planted["source"], target=planted["target"], host=fit_host)
    assert isinstance(back, TranslatorMapping) and back.residual_kind == "lowrank"
    import json

    from kvbridge.errors import ArtifactError

    manifest = json.loads((folder / "manifest.json").read_text())
    bad = tmp_path / "bad"
    import shutil

    shutil.copytree(folder, bad)
    (bad / "manifest.json").write_text(json.dumps({**manifest, "mode": "dense"}))
    with pytest.raises(ArtifactError, match="disagree"):
        load_mapping(bad, host=fit_host)
    assert back.report.training["after"] == mapping.report.training["after"]
    src, tgt = planted["source"], planted["target"]
    state = fit_host.adapter_of(src).extract(src, token_ids(2, 24, seed=5))
    spec = fit_host.adapter_of(tgt).spec_of(tgt)
    a, b = transfer(state, mapping, spec, host=fit_host), transfer(state, back, spec, host=fit_host)
    assert all(torch.equal(x, y) for x, y in zip(a.keys + a.values, b.keys + b.values))
    from kvbridge.fit.mapping import FittedMapping

    ridge_only = FittedMapping(mapping.source_spec, mapping.target_spec, mapping.layers, fitter="ridge")
    r = transfer(state, ridge_only, spec, host=fit_host)
    assert max(float((x - y).abs().max()) for x, y in zip(a.values, r.values)) > 1e-4  # the residual is applied


def test_what_training_sees_is_what_a_transfer_gives(planted, fit_host, trained):
    """The training's mapped K/V (ridge cache + rotated residual) equal the transfer of the fitted
    mapping: RoPE is re-applied as the target uses it."""
    from kvbridge.fit.translator_data import collect, mapped
    from kvbridge.transfer import transfer

    mapping, _ = trained
    ridge = type(mapping).__mro__[1](mapping.source_spec, mapping.target_spec, mapping.layers, fitter="ridge")
    cal = PairedCalibration(
        planted["source"], planted["target"], planted["ids"][:2], CalibrationConfig(), host=fit_host
    )
    data = collect(cal, ridge, queries=8)
    params = {}
    for c in ("k", "v"):
        per = [mapping.layer_params(layer, c) for layer in range(len(mapping.layers))]
        params[c] = {n: torch.stack([p[n] for p in per]) for n in per[0]}
        data.x[c] = (data.x[c] - params[c]["mu"][:, None]) * params[c]["inv"][:, None]
    src = planted["source"]
    state = fit_host.adapter_of(src).extract(src, planted["ids"][:2])
    moved = transfer(state, mapping, cal.target_spec, host=fit_host)
    k, v = mapped(data, params, "lowrank", torch.arange(2))
    for layer in range(len(mapping.layers)):
        assert torch.allclose(k[:, layer], moved.keys[layer], atol=1e-4, rtol=1e-4)
        assert torch.allclose(v[:, layer], moved.values[layer], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotate_matches_the_rope_codec(interleaved):
    from kvbridge import rope
    from kvbridge.plugins import get_host
    from kvbridge.spec import RopeSpec

    spec = get_host().resolved(
        RopeSpec(head_dim=16, partial_factor=0.5 if not interleaved else 1.0, interleaved=interleaved)
    )
    k = torch.randn(2, 3, 7, 16, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(7)[None].expand(2, 7)
    cos, sin = rope.tables(spec, pos)
    assert torch.allclose(rotate(k, cos, sin, spec.rotary_dim, interleaved), rope.apply(k, pos, spec), atol=1e-6)


def test_the_kl_stage_runs_and_is_recorded(planted, fit_host):
    mapping = _fit(planted, fit_host, **{**MISFIT, "steps": 1, "kl_steps": 2, "kl_suffix": 4})
    stages = [c[1] for c in mapping.report.training["curve"]]
    assert "kl" in stages and "attention" in stages
    assert all(p.requires_grad for p in planted["target"].parameters())  # the target is left as it was


def test_an_mlp_residual_trains_too(planted, fit_host):
    mapping = _fit(planted, fit_host, **{**MISFIT, "rank": 0, "hidden": 8, "steps": 4})
    assert mapping.residual_kind == "mlp" and mapping.manifest["residual"]["size"] == 8
    tr = mapping.report.training
    assert tr["after"]["train"]["loss"] < tr["before"]["train"]["loss"]


@pytest.mark.parametrize(
    "values, words",
    [
        ({"rank": 0, "hidden": 0}, "no residual"),
        ({"rank": 4, "hidden": 8}, "not both"),
        ({"lr": "0"}, "lr=0.0"),
        ({"batch": "0"}, "batch=0"),
        ({"steps": "-1"}, "steps=-1"),
        ({"weight_decay": "nan"}, "weight_decay"),
    ],
)
def test_bad_options_are_refused_in_one_line(values, words):
    with pytest.raises(FitError) as err:
        build_options(TranslatorOptions, values)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_it_can_start_from_a_ridge_mapping_folder(planted, fit_host, tmp_path, trained):
    from kvbridge.fit import fit

    ridge_dir = tmp_path / "ridge"
    fit(
        planted["source"],
        planted["target"],
        planted["ids"],
        fitter="ridge",
        options={"top_k": 1, "alpha": 300.0},
        calibration=CalibrationConfig(stride=2, heldout=0.25),
        host=fit_host,
        distributed=None,
        out=ridge_dir,
    )
    whole, folder = trained
    again = _fit(planted, fit_host, init=str(ridge_dir), **MISFIT)
    assert _equal(whole, again)  # the same ridge start, the same training
    assert again.report.training["ridge_from"] == str(ridge_dir)
    with pytest.raises(FitError, match="not a ridge one"):
        _fit(planted, fit_host, init=str(folder), **MISFIT)


def test_progress_lines_carry_an_eta(planted, fit_host, capsys, monkeypatch):
    from kvbridge.fit import fit

    monkeypatch.setenv("KVBRIDGE_PROGRESS_EVERY", "0")  # a line per update
    fit(
        planted["source"],
        planted["target"],
        planted["ids"][:8],
        fitter="translator",
        options={**MISFIT, "steps": 3},
        calibration=CalibrationConfig(stride=2, heldout=0.25),
        host=fit_host,
        distributed=None,
        progress=lambda event: None,
    )
    err = capsys.readouterr().err
    assert "translator: 1/3 steps" in err and "ETA" in err and "translator data:" in err


def test_fit_resume_continues_the_training_too(planted, fit_host, tmp_path, monkeypatch, trained):
    """``kvbridge fit --resume`` (``fit(..., resume=True)``): the training state lives beside the
    calibration checkpoint (``.<out>.fitstate/translator/``) and the resumed fit equals a whole one."""
    from kvbridge import faults

    whole, _ = trained
    out = tmp_path / "m"
    opts = {**MISFIT, "checkpoint_every": 2}
    monkeypatch.setenv("KVBRIDGE_FAULT", "translator.step:5")
    faults.reset()
    with pytest.raises(faults.InjectedFault):
        _fit(planted, fit_host, out=out, fit_resume=True, **opts)
    monkeypatch.delenv("KVBRIDGE_FAULT")
    faults.reset()
    again = _fit(planted, fit_host, out=out, fit_resume=True, **opts)
    assert again.report.training["resumed_at_step"] == 4
    assert _equal(whole, again)
