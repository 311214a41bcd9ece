"""The compatibility check (kvbridge.check.compat) on real configs, manifests and synthetic specs."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

import importlib

models_resolve = importlib.import_module("kvbridge.models.resolve")
from kvbridge.check import compat
from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Finding
from kvbridge.plugins import make_host
from kvbridge.spec import FULL, SLIDING, ModelSpec, RopeSpec

SUPPORTED = [
    "Qwen__Qwen2-1.5B-Instruct",
    "Qwen__Qwen2.5-0.5B",
    "Qwen__Qwen2.5-1.5B-Instruct",
    "Qwen__Qwen3-4B",
    "meta-llama__Llama-2-7b-chat-hf",
    "meta-llama__Llama-3.2-1B",
    "meta-llama__Llama-3.2-3B-Instruct",
    "microsoft__phi-2",
    "mistralai__Mistral-7B-v0.1",
    "openai-community__gpt2",
]
SPEC_KEYS = {
    "model_type",
    "num_layers",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "positional",
    "rope",
    "sliding_window",
    "layer_types",
    "dtype",
    "vocab_size",
}
ROPE_KEYS = {"type", "theta", "partial_factor", "interleaved", "scaling"}


pytestmark = pytest.mark.usefixtures("isolated_env")


def spec_of(configs: Path, name: str, host):
    return models_resolve.resolve(str(configs / name), host=host).spec(host)


def check(a, b, host, **kw):
    from kvbridge.models.compat import check_models

    return check_models(a, b, host=host, **kw)


# -- facts a careful reader takes from each real config ---------------------------------------------------------
def test_llama_3_2_rope_is_llama3_factor_32(configs, host):
    for name in ("meta-llama__Llama-3.2-1B", "meta-llama__Llama-3.2-3B-Instruct"):
        spec = spec_of(configs, name, host)
        assert spec.rope.rope_type == "llama3" and spec.rope.theta == 500000.0
        assert spec.rope.param("factor") == 32.0
        assert spec.rope.param("low_freq_factor") == 1.0 and spec.rope.param("high_freq_factor") == 4.0
        assert spec.rope.param("original_max_position_embeddings") == 8192
        assert spec.num_kv_heads == 8 and spec.max_position_embeddings == 131072
    assert spec_of(configs, "meta-llama__Llama-3.2-1B", host).head_dim == 64  # explicit head_dim 64
    three = spec_of(configs, "meta-llama__Llama-3.2-3B-Instruct", host)
    assert (three.num_layers, three.num_attention_heads, three.head_dim) == (28, 24, 128)


def test_mistral_sliding_window_4096(configs, host):
    spec = spec_of(configs, "mistralai__Mistral-7B-v0.1", host)
    assert spec.sliding_window == 4096 and set(spec.layer_types) == {SLIDING}
    assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (32, 8, 128)
    assert spec.rope.theta == 10000.0


def test_phi2_partial_rotary_0_4(configs, host):
    spec = spec_of(configs, "microsoft__phi-2", host)
    assert spec.rope.partial_factor == pytest.approx(0.4) and spec.head_dim == 80
    assert spec.rope.rotary_dim == 32 and spec.rope.interleaved is False
    assert spec.dtype == "float16" and spec.vocab_size == 51200


def test_gpt2_absolute_positions(configs, host):
    spec = spec_of(configs, "openai-community__gpt2", host)
    assert spec.positional == "absolute" and spec.rope is None
    assert (spec.num_layers, spec.num_attention_heads, spec.head_dim, spec.hidden_size) == (12, 12, 64, 768)
    assert spec.max_position_embeddings == 1024 and spec.vocab_size == 50257


def test_qwen2_kv_heads_and_unused_window(configs, host):
    for name, heads, layers in (
        ("Qwen__Qwen2-1.5B-Instruct", 12, 28),
        ("Qwen__Qwen2.5-1.5B-Instruct", 12, 28),
        ("Qwen__Qwen2.5-0.5B", 14, 24),
    ):
        spec = spec_of(configs, name, host)
        assert spec.num_kv_heads == 2 and spec.num_attention_heads == heads and spec.num_layers == layers
        assert spec.rope.theta == 1_000_000.0
        assert spec.attention_kind == "full"  # sliding_window 32768 is set but use_sliding_window is false


def test_qwen3_explicit_head_dim_and_qk_norm(configs, host):
    spec = spec_of(configs, "Qwen__Qwen3-4B", host)
    assert spec.head_dim == 128 != spec.hidden_size // spec.num_attention_heads
    assert spec.qk_norm is True and spec.num_kv_heads == 8 and spec.num_layers == 36


def test_llama2_defaults(configs, host):
    spec = spec_of(configs, "meta-llama__Llama-2-7b-chat-hf", host)
    assert spec.rope.theta == 10000.0 and spec.rope.rope_type == "default"  # no rope_theta key
    assert spec.num_kv_heads == spec.num_attention_heads == 32 and spec.dtype == "float16"


def test_every_real_config_is_checked(configs, host):
    """check runs on every pair of real configs; the JSON is stable and serialisable."""
    names = sorted(p.name for p in configs.iterdir() if (p / "config.json").is_file())
    assert set(SUPPORTED) <= set(names)
    for a, b in itertools.product(SUPPORTED, repeat=2):
        report = check(str(configs / a), str(configs / b), host)
        data = json.loads(report.to_json())
        assert list(data) == ["source", "target", "axes", "verdict", "reasons", "measured"]
        assert data["verdict"] in compat.VERDICTS and data["reasons"]
        assert [x["name"] for x in data["axes"][: len(compat.AXES)]] == list(compat.AXES)
        for axis in data["axes"]:
            assert set(axis) == {"name", "source", "target", "verdict", "action"} and axis["action"]
        for side in ("source", "target"):
            assert SPEC_KEYS <= set(data[side])
            if data[side]["rope"] is not None:
                assert ROPE_KEYS <= set(data[side]["rope"])
        if a == b:
            assert data["verdict"] == "identity", a
        if "gpt2" in (a + b) and a != b:
            assert data["verdict"] == "incompatible"
            assert report.axis("positional").verdict == "blocking"


def test_deepseek_mla_cross_model_is_refused_with_the_reason(configs, host):
    r = check(str(configs / "deepseek-ai__DeepSeek-V2-Lite"), str(configs / "Qwen__Qwen3-4B"), host)
    assert r.verdict == "incompatible"
    action = r.axis("cache_format").action
    assert "MLA" in action and "rank 512" in action and "RoPE key of 64 dims" in action
    same = check(str(configs / "deepseek-ai__DeepSeek-V2-Lite"), str(configs / "deepseek-ai__DeepSeek-V2-Lite"), host)
    assert same.verdict == "identity"


def test_sparse_attention_indexer_keys_block_a_cross_model_transfer(host):
    """Indexer keys come from the target's own indexer: another model's cache cannot provide them."""
    from kvbridge.conformance.tiny import tiny_config_dict

    glm, dsv32 = tiny_config_dict("glm_moe_dsa"), tiny_config_dict("deepseek_v32")
    spec = lambda d: host.adapter_for(d).describe(d)  # noqa: E731
    r = compat.check(compat.Side(spec(glm), config=glm), compat.Side(spec(dsv32), config=dsv32), host=host)
    assert r.verdict == "incompatible" and r.axis("indexer keys").verdict == "blocking"
    assert "cannot be mapped" in r.axis("indexer keys").action
    same = compat.check(
        compat.Side(spec(glm), config=glm), compat.Side(spec(glm), config=glm), host=host, same_model=True
    )
    assert same.axis("indexer keys").verdict == "same" and same.verdict == "identity"


# -- verdicts ---------------------------------------------------------------------------------------------------
def test_same_family_different_size_is_mappable(configs, host):
    r = check(str(configs / "meta-llama__Llama-3.2-1B"), str(configs / "meta-llama__Llama-3.2-3B-Instruct"), host)
    assert r.verdict == "mappable"
    assert r.axis("layers").verdict == "mappable" and r.axis("head_dim").verdict == "mappable"
    assert r.axis("kv_heads").verdict == "same" and r.axis("rope").verdict == "same"
    assert "layers" in r.reasons[0] and "head_dim" in r.reasons[0]


def test_same_kv_shapes_different_models_is_still_mappable(host):
    """Qwen3-0.6B and 1.7B cache the same shapes (28 x 8 x 128) but are different models."""
    r = check("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", host)
    assert [r.axis(n).verdict for n in ("layers", "kv_heads", "head_dim")] == ["same"] * 3
    assert r.axis("model").verdict == "mappable" and "hidden_size" in r.axis("model").action
    assert r.verdict == "mappable"


def test_issue_example_qwen25_pair(host):
    r = check("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", host)
    assert r.verdict == "mappable" and r.ok and r.exit_code() == 0
    assert r.axis("layers").source == 24 and r.axis("layers").target == 28
    tok = r.axis("tokenizer")
    assert tok.source.startswith("bpe") and tok.target == "unknown" and tok.verdict == "mappable"


def test_rope_only_difference_is_rope_reapply(configs, host):
    r = check(str(configs / "mistralai__Mistral-7B-v0.1"), "mistralai/Mistral-7B-Instruct-v0.2", host)
    assert r.verdict == "rope-reapply"
    assert r.axis("rope").verdict == "mappable" and "1e+06" in r.axis("rope").action
    assert r.axis("attention").verdict == "mappable"  # sliding 4096 -> full
    assert r.strict_failures()  # the attention change fails --strict


def test_same_geometry_other_checkpoint_is_identity_with_caveat(configs, host):
    r = check(str(configs / "Qwen__Qwen2-1.5B-Instruct"), str(configs / "Qwen__Qwen2.5-1.5B-Instruct"), host)
    assert r.verdict == "identity"
    assert any("weights are not compared" in x for x in r.reasons)


def test_same_model_passes_strict(host):
    r = check("Qwen/Qwen3-8B", "qwen3-8b", host)
    assert r.verdict == "identity" and r.axis("tokenizer").verdict == "same"
    assert r.strict_failures() == [] and r.exit_code(strict=True) == 0


def test_dtype_cast_is_a_note(tmp_path, configs, host):
    cfg = json.loads((configs / "meta-llama__Llama-2-7b-chat-hf" / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = check(str(configs / "meta-llama__Llama-2-7b-chat-hf"), str(tmp_path), host)
    assert r.verdict == "identity" and r.axis("dtype").verdict == "mappable"
    assert "float16 to bfloat16" in r.axis("dtype").action
    assert r.exit_code() == 0 and r.exit_code(strict=True) == 1


def test_tokenizer_axis_from_files(configs, shared_dir, host):
    tok = shared_dir / "fixtures" / "tokenizers"
    r = check(
        str(configs / "openai-community__gpt2"),
        str(configs / "openai-community__gpt2"),
        host,
        source_tokenizer=str(tok / "gpt2"),
        target_tokenizer=str(tok / "gpt2"),
    )
    assert r.axis("tokenizer").verdict == "same"
    r = check(
        str(configs / "Qwen__Qwen2.5-0.5B"),
        str(configs / "Qwen__Qwen3-4B"),
        host,
        source_tokenizer=str(tok / "qwen2.5"),
        target_tokenizer=str(tok / "gpt2" / "vocab.json"),
    )
    assert r.axis("tokenizer").verdict == "blocking" and r.verdict == "incompatible"
    assert any(x.startswith("tokenizer:") for x in r.reasons)


def test_manifest_tokenizers(host):
    r = check("mistralai/Mistral-7B-v0.1", "meta-llama/Llama-2-7b-hf", host)
    assert r.axis("tokenizer").verdict == "blocking"  # both 32000 pieces, different vocabularies
    r = check("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf", host)
    assert r.axis("tokenizer").verdict == "same" and r.verdict == "identity"


def test_hybrid_layouts_and_sliding_history(host):
    same = check("google/gemma-2-2b", "google/gemma-2-2b", host)
    assert same.verdict == "identity" and "sliding-history" not in [a.name for a in same.axes]
    assert same.axis("cache_format").source == "hybrid"  # cache_implementation in the config
    r = check("google/gemma-3-1b-it", "Qwen/Qwen3-0.6B", host)
    assert r.axis("attention").source.startswith("hybrid 22 sliding 512")
    assert r.axis("attention").verdict == "mappable"
    assert r.axis("sliding-history").verdict == "warning"
    assert any(x.startswith("warning:") for x in r.reasons)
    assert r.axis("rope").source["by_layer_type"]["sliding_attention"]["theta"] == 10000.0


def test_known_degrading_size_gap(host):
    r = check("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B", host)
    finding = r.axis("known-results")
    assert finding.verdict == "warning" and "72.8%" in finding.action
    assert r.exit_code() == 0 and r.exit_code(strict=True) == 1


def test_mqa_falcon_and_interleaved_families(host):
    r = check("tiiuae/falcon-7b", "EleutherAI/gpt-j-6b", host)
    assert r.axis("kv_heads").source == 1 and "MQA" in r.axis("kv_heads").action
    assert r.axis("rope").verdict == "mappable" and "interleaved" in r.axis("rope").action
    assert r.axis("cross-family").verdict == "info"


def test_falcon_new_architecture_duplicated_heads(host):
    from kvbridge.builtin.families.falcon import ADAPTER

    cfg = ADAPTER.tiny_configs()["new_arch"]
    spec = ADAPTER.describe(cfg)
    other = dataclasses.replace(spec, num_kv_heads=2)
    r = compat.check(spec, other, host=host)
    assert "duplicated" in r.axis("kv_heads").action and r.axis("kv_heads").source == 4


# -- synthetic specs: the positional matrix, RoPE details, plugins ---------------------------------------------------
def make(positional="rope", layers=2, kv=2, head_dim=16, rope=None, **kw) -> ModelSpec:
    if positional == "rope" and rope is None:
        rope = RopeSpec(head_dim=head_dim)
    return ModelSpec(
        model_type=kw.pop("model_type", "llama"),
        num_layers=layers,
        num_attention_heads=4,
        num_kv_heads=kv,
        head_dim=head_dim,
        hidden_size=64,
        positional=positional,
        rope=rope if positional == "rope" else None,
        layer_types=kw.pop("layer_types", (FULL,) * layers),
        **kw,
    )


@pytest.mark.parametrize(
    "src,tgt,verdict",
    [
        ("rope", "rope", "same"),
        ("absolute", "absolute", "same"),
        ("alibi", "alibi", "same"),
        ("rope", "absolute", "blocking"),
        ("absolute", "rope", "blocking"),
        ("absolute", "alibi", "blocking"),
        ("alibi", "absolute", "blocking"),
        ("none", "absolute", "blocking"),
        ("rope", "alibi", "mappable"),
        ("alibi", "rope", "mappable"),
        ("none", "rope", "mappable"),
        ("alibi", "none", "same"),
    ],
)
def test_positional_matrix(src, tgt, verdict, host):
    r = compat.check(make(src), make(tgt), host=host, plugins=False)
    assert r.axis("positional").verdict == verdict
    assert (r.verdict == "incompatible") == (verdict == "blocking")
    if verdict == "mappable":
        assert r.verdict in ("rope-reapply", "mappable")


def test_rope_details(host):
    base = make()
    theta = make(rope=RopeSpec(theta=500000.0, head_dim=16))
    r = compat.check(base, theta, host=host, plugins=False)
    assert r.verdict == "rope-reapply" and r.axis("rope").verdict == "mappable"
    dyn = make(rope=RopeSpec.make("dynamic", head_dim=16, factor=2.0, max_position_embeddings=64))
    assert "rope_lengths" in compat.check(dyn, base, host=host, plugins=False).axis("rope").action
    inter = make(rope=RopeSpec(head_dim=16, interleaved=True))
    assert "interleaved" in compat.check(inter, base, host=host, plugins=False).axis("rope").action
    partial = make(rope=RopeSpec(head_dim=16, partial_factor=0.5))
    assert compat.check(partial, base, host=host, plugins=False).axis("rope").verdict == "mappable"


def test_sliding_and_no_kv_layers(host):
    sliding = make(layers=4, sliding_window=8, layer_types=(SLIDING,) * 4)
    full = make(layers=4)
    r = compat.check(sliding, full, host=host)
    assert r.axis("attention").verdict == "mappable" and "last 8 tokens" in r.axis("attention").action
    assert r.axis("sliding-history").verdict == "warning"
    skip = make(layers=4, no_kv_layers=(3,))
    r = compat.check(skip, full, host=host, plugins=False)
    assert r.axis("layers").verdict == "mappable" and "3 -> 4 KV layers" in r.axis("layers").action
    assert "without KV" in r.axis("attention").source


def test_cache_formats(host):
    spec = make()
    fmt = compat.cache_format_of(
        spec, {}, {"cache_implementation": "quantized", "cache_config": {"backend": "quanto", "nbits": 4}}
    )
    assert fmt == "quantized (quanto, 4-bit)"
    r = compat.check(
        compat.Side(spec, generation={"cache_implementation": "quantized"}),
        compat.Side(spec, config={"cache_implementation": "static"}),
        host=host,
    )
    assert r.axis("cache_format").verdict == "mappable" and "DynamicCache" in r.axis("cache_format").action


class _Plugin:
    @hookimpl
    def kvbridge_check_compatibility(self, source, target):
        return [
            Finding("layers", "blocking", "this pair is known to break", 1, 2),
            Finding("house-rule", "warning", "ask the team first"),
        ]


def test_plugin_findings_are_merged():
    host = make_host(entry_points=False, extra=[("houseplugin", _Plugin())])
    r = compat.check(make(), make(), host=host)
    layers = r.axis("layers")
    assert layers.verdict == "blocking" and "known to break" in layers.action and layers.plugin == "houseplugin"
    assert "[plugin: houseplugin]" in layers.action
    assert r.axis("house-rule").verdict == "warning"
    assert r.verdict == "incompatible" and any("known to break" in x for x in r.reasons)
    assert r.exit_code() == 1
    assert {f.plugin for f in r.findings} >= {"houseplugin"}


def test_report_is_frozen_and_plugins_optional(host):
    r = compat.check(make(), make(), host=host, plugins=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.verdict = "mappable"  # type: ignore[misc]
    assert [a.name for a in r.axes] == list(compat.AXES) and r.findings == ()
    assert r.verdict == "identity" and r.to_dict()["axes"][0]["name"] == "model"


def test_check_runs_on_every_fixture_folder(configs, host):
    """Every folder under fixtures/configs gets a report, or a one-line exit-2 refusal naming its file."""
    for folder in sorted(p for p in configs.iterdir() if (p / "config.json").is_file()):
        try:
            report = check(str(folder), str(folder), host)
        except Exception as exc:
            assert getattr(exc, "exit_code", None) == 2, folder.name
            assert str(folder / "config.json") in str(exc) and "\n" not in str(exc)
            continue
        assert report.verdict == "identity" and report.exit_code(strict=True) == 0, folder.name


def test_same_config_different_weights_is_mappable_not_identity(tmp_path):
    """A fine-tune (same config, other weight files) is not reported as an exact identity."""
    import json

    from kvbridge.models.compat import check_models

    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 64,
        "max_position_embeddings": 64,
    }
    folders = {}
    for name, payload in (("a", b"weights-a"), ("b", b"weights-b"), ("c", b"weights-a")):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "model.safetensors").write_bytes(payload)
        folders[name] = str(d)
    differ = check_models(folders["a"], folders["b"])
    model = next(a for a in differ.axes if a.name == "model")
    assert model.verdict == "mappable" and "different weights" in model.action
    assert differ.verdict == "mappable"
    same = check_models(folders["a"], folders["c"])
    assert same.verdict == "identity"
    assert next(a for a in same.axes if a.name == "model").action.startswith("same config and the same weight")


def test_nope_layers_that_differ_are_named(host):
    a = make(layers=8, nope_layers=(3, 7))
    b = make(layers=8, nope_layers=(3,))
    r = compat.check(a, b, host=host, plugins=False)
    axis = r.axis("rope")
    assert axis.verdict == "mappable" and "[7] are NoPE only in the source" in axis.action
    assert axis.source["nope_layers"] == [3, 7] and axis.target["nope_layers"] == [3]
    assert r.verdict == "rope-reapply"
    assert compat.check(a, a, host=host, plugins=False).axis("rope").verdict == "same"


def test_hybrid_recurrent_target_is_refused_attention_source_maps(host):
    hybrid = make(layers=4, cache_format="hybrid", state_layers=(0, 1, 2), no_kv_layers=(0, 1, 2))
    plain = make(layers=4)
    into = compat.check(plain, hybrid, host=host, plugins=False)
    assert into.verdict == "incompatible" and "recurrent" in into.axis("cache_format").action
    out = compat.check(hybrid, plain, host=host, plugins=False)
    assert out.ok and "only its attention layers [3] map" in out.axis("cache_format").action
