"""kvbridge-codegen: the kvbridge contract suite, plus CodeGen-specific facts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvbridge_codegen import ADAPTER, MANIFESTS, CodeGenAdapter

from kvbridge.errors import ConfigError
from kvbridge.plugins import make_host
from kvbridge.testing.contract import AdapterContract, check_extract_shapes


class TestCodeGenContract(AdapterContract):
    """The contract every kvbridge family adapter passes (shapes, RoPE round trip, exact identity)."""

    adapter = ADAPTER


def test_describe_tiny_config():
    spec = ADAPTER.describe(ADAPTER.tiny_config())
    assert (spec.num_layers, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (2, 4, 4, 16)
    assert spec.positional == "rope" and spec.rope.interleaved is True
    assert spec.rope.rotary_dim == 8 and spec.rope.theta == 10000.0
    assert spec.layer_types == ("full_attention",) * 2 and spec.sliding_window is None


def test_describe_reads_legacy_and_alias_names():
    cfg = {"model_type": "codegen", "num_hidden_layers": 3, "num_attention_heads": 4, "hidden_size": 64,
           "max_position_embeddings": 32, "rotary_dim": 16}
    spec = ADAPTER.describe(cfg)
    assert (spec.num_layers, spec.head_dim, spec.rope.rotary_dim, spec.max_position_embeddings) == (3, 16, 16, 32)


@pytest.mark.parametrize("field,value,needle", [
    ("rotary_dim", 7, "rotary_dim"),
    ("rotary_dim", None, "rotary_dim"),
    ("rotary_dim", 32, "rotary_dim"),  # > head_dim 16
    ("n_embd", 66, "n_embd"),
    ("n_layer", -1, "n_layer"),
])
def test_bad_configs_name_the_field(field, value, needle):
    cfg = dict(ADAPTER.tiny_config(), **{field: value})
    with pytest.raises(ConfigError) as info:
        ADAPTER.describe(cfg)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_cache_shapes_match_spec_for_both_tiny_configs():
    for cfg in ADAPTER.tiny_configs().values():
        state = check_extract_shapes(ADAPTER, cfg, seq_len=7, batch=2)
        assert state.keys[0].shape == (2, 4, 7, 16)


def test_spec_rope_matches_the_models_own_sinusoids():
    """The spec's interleaved RoPE is exactly CodeGen's rotary table."""
    import torch

    model = ADAPTER.build_model(ADAPTER.tiny_config())
    spec = ADAPTER.spec_of(model)
    rot = ADAPTER.rotary_embedding(model)
    pos = torch.arange(10)[None]
    sin, cos = rot(torch.zeros(1), pos)
    dim = spec.rope.rotary_dim
    inv = 1.0 / (spec.rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    ang = pos[0, :, None].float() * inv
    assert torch.allclose(sin[0], torch.sin(ang), atol=1e-6) and torch.allclose(cos[0], torch.cos(ang), atol=1e-6)


def test_registered_through_the_entry_point():
    host = make_host()
    names = {r.name: r for r in host.records}
    if "codegen" not in names:
        pytest.skip("kvbridge-codegen is not installed (pip install -e plugins/kvbridge-codegen)")
    assert names["codegen"].error is None
    assert isinstance(host.adapter_for({"model_type": "codegen"}), CodeGenAdapter)


def test_manifest_geometry_regenerates():
    from kvbridge.check.sources import geometry_diff, spec_geometry, validate_manifest

    files = sorted(MANIFESTS.glob("*.json"))
    assert files, "the plugin ships at least one manifest"
    for path in files:
        record = validate_manifest(json.loads(path.read_text()), path)
        assert record["family"] == "codegen"
        assert geometry_diff(record["geometry"], spec_geometry(ADAPTER.describe(record["config"]))) == []


def test_kvbridge_check_on_the_codegen_manifest_without_torch():
    env = dict(os.environ, KVBRIDGE_MANIFEST_PATH=str(MANIFESTS), KVBRIDGE_NO_CACHE="1")
    code = ("import sys, json; from kvbridge.cli.main import main\n"
            "try:\n    main(['check', 'Salesforce/codegen-350M-mono', 'Salesforce/codegen-350M-mono', '--json'])\n"
            "except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "print('TORCH', 'torch' in sys.modules, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["verdict"] == "identity"
    assert report["source"]["rope"]["interleaved"] is True
    assert report["source"]["rope"]["rotary_dim"] == 32
