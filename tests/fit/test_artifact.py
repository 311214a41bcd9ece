"""Mapping folders: round trip, schema, checksum and fingerprint refusals, atomic writes."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from kvbridge.errors import ArtifactError
from kvbridge.fit.artifact import MappingMismatchWarning, load_mapping, save_mapping, schema, validate
from kvbridge.fit.ridge import FitError


@pytest.fixture(scope="module")
def saved(tmp_path_factory, planted_fit):
    out = tmp_path_factory.mktemp("maps") / "m"
    save_mapping(planted_fit, out)
    return out


def _random_content(spec, tokens=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (1, spec.num_kv_heads, tokens, spec.head_dim)
    return (
        [torch.randn(shape, generator=g) for _ in range(spec.num_layers)],
        [torch.randn(shape, generator=g) for _ in range(spec.num_layers)],
    )


def test_round_trip_gives_the_same_mapping(saved, planted, planted_fit):
    loaded = load_mapping(saved, source=planted["source"], target=planted["target"])
    keys, values = _random_content(planted_fit.source_spec)
    a = planted_fit.map_tensors(keys, values)
    b = loaded.map_tensors(keys, values)
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-5)  # same numbers (BLAS may block differently)
    assert loaded.exact is False and loaded.layer_selection() == planted_fit.layer_selection()


def test_manifest_has_what_the_issue_lists(saved, planted):
    m = json.loads((saved / "manifest.json").read_text())
    validate(m)
    assert m["schema_version"] == 1 and m["kvbridge_version"] and m["transformers_version"]
    for role in ("source", "target"):
        side = m[role]
        assert side["spec"]["num_layers"] == planted[role].config.num_hidden_layers
        assert len(side["config_fingerprint"]) == len(side["weights_fingerprint"]) == 64
        assert side["rope"]["default"]["type"] == "default"
    assert m["fitter"] == {
        "name": "ridge",
        "params": {
            "top_k": 2,
            "alpha": 0.01,
            "low_r2": 0.5,
            "memory_budget": m["fitter"]["params"]["memory_budget"],
            "support": "layers",
            "weighting": "uniform",
            "select": "r2",
            "select_prefix": 0.5,
            "select_suffix": 32,
            "gram_dtype": "float32",  # the statistics GEMMs' dtype, recorded with the options
        },
    }
    assert len(m["heldout_r2"]["k"]) == 6 and len(m["heldout_r2"]["k"][0]) == 4  # [layer][head]
    assert m["calibration"]["tokens"] == 40 * 48 and m["calibration"]["stride"] == 2
    assert m["calibration"]["token_ids_sha256"] and m["tensor_file"] == "mapping.safetensors"
    assert len(m["tensor_sha256"]) == 64 and m["dtype"] == "float32"
    assert m["layer_selection"][0][0] == 0


def test_schema_validation_names_the_missing_field(saved):
    m = json.loads((saved / "manifest.json").read_text())
    del m["target"]["weights_fingerprint"]
    with pytest.raises(ArtifactError, match="target.weights_fingerprint"):
        validate(m)
    assert schema()["properties"]["kind"]["const"] == "kvbridge-mapping"


def test_a_corrupt_tensor_file_is_refused(saved, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(saved, bad)
    data = bytearray((bad / "mapping.safetensors").read_bytes())
    data[-5] ^= 0xFF
    (bad / "mapping.safetensors").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        load_mapping(bad)


def test_other_models_are_refused_naming_the_field_unless_forced(saved, planted):
    import copy

    other = copy.deepcopy(planted["target"])
    with torch.no_grad():
        other.model.layers[0].self_attn.k_proj.weight.add_(1e-3)
    with pytest.raises(ArtifactError, match=r"target\.weights_fingerprint"):
        load_mapping(saved, source=planted["source"], target=other)
    cfg = planted["source"].config.to_dict()
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    with pytest.raises(ArtifactError, match=r"source\.(spec|config)_fingerprint"):
        load_mapping(saved, source=cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mapping = load_mapping(saved, source=planted["source"], target=other, force=True)
    assert mapping is not None
    assert any(
        issubclass(w.category, MappingMismatchWarning) and "target.weights_fingerprint" in str(w.message)
        for w in caught
    )


def test_existing_output_is_refused_and_failed_fits_write_nothing(planted, fit_host, saved, tmp_path):
    from kvbridge.fit import fit

    with pytest.raises(ArtifactError, match="already exists"):
        fit(planted["source"], planted["target"], planted["ids"][:4], out=saved, host=fit_host, distributed=None)
    out = tmp_path / "never"
    with pytest.raises(FitError):
        fit(planted["source"], planted["target"], planted["ids"][:4], top_k=4, out=out, host=fit_host, distributed=None)
    assert not out.exists() and not list(tmp_path.iterdir())
