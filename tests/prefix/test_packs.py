"""Prefix packs: save once, restore with zero forward passes, refuse what does not match."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from kvbridge.errors import ArtifactError, KVBridgeError
from kvbridge.prefix.packs import (
    PackForceWarning,
    PackMismatchError,
    load_pack,
    read_pack,
    recompute_check,
    save_pack,
)
from kvbridge.models.tokenizer_load import load_tokenizer
from kvbridge.prefix.splits import SplitError, encode

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "src" / "kvbridge" / "manifests" / "schemas" / "prefix-pack.schema.json"


@pytest.fixture(scope="module")
def make_model(tiny_llama):
    """A seeded tiny Llama with 128 positions (keyword overrides pass through to its config)."""
    return lambda tok, **kw: tiny_llama.model(tok, **{"max_position_embeddings": 128, **kw})


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_llama, make_model):
    from kvbridge.models import load

    root = tmp_path_factory.mktemp("packs")
    tok = tiny_llama.tok
    folder = tiny_llama.save(root / "model", make_model(tok), tok)
    model = load(str(folder), tokenizer=False).model
    tok = load_tokenizer(folder)
    pack = save_pack(model, root / "pack", guide_text=tiny_llama.guide, tokenizer=tok, model_dir=folder)
    return {"root": root, "folder": folder, "model": model, "tok": tok, "pack": pack}


def validate(instance, schema, where="manifest"):
    """The subset of JSON Schema the pack schema uses (jsonschema is not a dependency)."""
    types = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "boolean": bool,
        "null": type(None),
        "number": (int, float),
    }
    want = schema.get("type")
    if want is not None:
        names = want if isinstance(want, list) else [want]
        ok = any(
            isinstance(instance, types[n]) and not (n in ("integer", "number") and isinstance(instance, bool))
            for n in names
        )
        assert ok, f"{where}: {instance!r} is not {want}"
    if "const" in schema:
        assert instance == schema["const"], f"{where}: {instance!r} != {schema['const']!r}"
    if "enum" in schema:
        assert instance in schema["enum"], f"{where}: {instance!r} not in {schema['enum']}"
    if "pattern" in schema and isinstance(instance, str):
        assert re.search(schema["pattern"], instance), f"{where}: {instance!r} !~ {schema['pattern']}"
    if "minimum" in schema and isinstance(instance, int):
        assert instance >= schema["minimum"], f"{where}: {instance} < {schema['minimum']}"
    if isinstance(instance, dict):
        for key in schema.get("required", []):
            assert key in instance, f"{where}: missing {key!r}"
        for key, sub in schema.get("properties", {}).items():
            if key in instance:
                validate(instance[key], sub, f"{where}.{key}")
    if isinstance(instance, list):
        assert len(instance) >= schema.get("minItems", 0), f"{where}: too few items"
        for i, item in enumerate(instance):
            if "items" in schema:
                validate(item, schema["items"], f"{where}[{i}]")


class ForwardCounter:
    """Counts forward calls of a model and every submodule (pre-hooks with kwargs)."""

    def __init__(self, model):
        self.calls = 0
        self.handles = [m.register_forward_pre_hook(self._hook, with_kwargs=True) for m in model.modules()]

    def _hook(self, module, args, kwargs):
        self.calls += 1

    def remove(self):
        for h in self.handles:
            h.remove()


# -- manifest -------------------------------------------------------------------------------------
def test_manifest_validates_against_the_schema(env, tiny_guide):
    manifest = json.loads((env["pack"] / "manifest.json").read_text())
    validate(manifest, json.loads(SCHEMA.read_text()))
    import transformers

    assert manifest["guide"]["token_ids"] == encode(env["tok"], tiny_guide, add_special_tokens=True)
    assert manifest["guide"]["token_ids"][0] == env["tok"].bos_token_id
    assert manifest["guide"]["text"] == tiny_guide
    assert manifest["positions"] == {"start": 0, "stop": len(manifest["guide"]["token_ids"]), "kind": "prefix"}
    assert manifest["transformers_version"] == transformers.__version__
    assert manifest["model"]["id"] == "model" and manifest["tokenizer"]["source"] == "tokenizer_fp"
    assert manifest["cache_format"]["keys"] == "post_rope" and manifest["dtype"] == "float32"
    assert manifest["positional"]["rope"]["theta"] == 10000.0
    assert sorted(p.name for p in env["pack"].iterdir()) == [
        ".kvbridge-artifact.json",
        "kv.safetensors",
        "manifest.json",
    ]


def test_schema_check_rejects_a_broken_manifest(env):
    manifest = json.loads((env["pack"] / "manifest.json").read_text())
    schema = json.loads(SCHEMA.read_text())
    del manifest["model"]["weights_fingerprint"]
    with pytest.raises(AssertionError, match="weights_fingerprint"):
        validate(manifest, schema)


# -- loading --------------------------------------------------------------------------------------
def test_load_runs_zero_forward_passes(env):
    model = env["model"]
    counter = ForwardCounter(model)
    try:
        pack = load_pack(env["pack"], model, tokenizer=env["tok"], tokenizer_dir=env["folder"])
        cache = pack.cache(model)
    finally:
        counter.remove()
    assert counter.calls == 0
    assert cache.get_seq_length() == pack.num_tokens and not pack.forced


def test_continuation_equals_ordinary_prefill(env, tiny_prompt):
    model, tok = env["model"], env["tok"]
    pack = load_pack(env["pack"], model, tokenizer=tok, tokenizer_dir=env["folder"])
    _, split = pack.split_for(tok, tiny_prompt)
    ids = torch.tensor([list(split.ids)])
    kwargs = dict(max_new_tokens=12, do_sample=False, return_dict_in_generate=True, output_logits=True, pad_token_id=0)
    got = pack.generate(model, ids, **kwargs)
    want = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    diff = max(float((a - b).abs().max()) for a, b in zip(got.logits, want.logits))
    assert diff <= 1e-6
    # against the same prefix prefilled now (extract), the continuation is bit for bit identical
    from kvbridge.handoff import generate
    from kvbridge.plugins import get_host

    fresh = get_host().adapter_for(model.config.to_dict()).extract(model, torch.tensor([pack.guide_ids]))
    again = generate(model, fresh, ids, **kwargs)
    assert torch.equal(again.sequences, got.sequences)
    assert all(torch.equal(a, b) for a, b in zip(again.logits, got.logits))
    assert recompute_check(pack, model) == 0.0


def test_split_for_needs_the_guide_text_and_a_prompt(env, tmp_path, tiny_prompt):
    pack = load_pack(env["pack"], env["model"], tokenizer=env["tok"])
    with pytest.raises(SplitError, match="live text is empty"):
        pack.split_for(env["tok"], "", sep=" ")
    ids_only = save_pack(env["model"], tmp_path / "ids", guide_ids=pack.guide_ids)
    bare = load_pack(ids_only, env["model"])
    assert bare.guide_text is None and bare.manifest["tokenizer"]["source"] == "none"
    with pytest.raises(SplitError, match="stores no guide text"):
        bare.split_for(env["tok"], tiny_prompt)


# -- stored layouts -------------------------------------------------------------------------------
def _rewrite(folder: Path, tensors: dict, **manifest_changes) -> None:
    """Replace a pack's tensor file (checksum and listing fixed up, as a careful forger would)."""
    from kvbridge.artifacts import save_safetensors

    digest = save_safetensors(tensors, folder / "kv.safetensors")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(tensor_sha256=digest, **manifest_changes)
    manifest["tensors"] = {
        k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)} for k, v in tensors.items()
    }
    for key in [k for k, v in manifest_changes.items() if v is None]:
        del manifest[key]
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _next_logits(model, cache):
    with torch.no_grad():
        return model(input_ids=torch.tensor([[3]]), cache=cache, use_cache=True).logits


def test_kv_is_stored_stacked_and_a_schema_1_pack_still_loads(env, tmp_path):
    """Schema 2 stores K/V as one tensor [layers, 2, batch, heads, tokens, dim]; read_pack gives the
    per-layer names (views); a schema 1 pack (per-layer tensors, no kv_layout) restores the same
    cache, bit for bit."""
    import shutil

    from safetensors import safe_open

    manifest = json.loads((env["pack"] / "manifest.json").read_text())
    assert manifest["schema_version"] == 2 and manifest["kv_layout"] == "stacked"
    with safe_open(str(env["pack"] / "kv.safetensors"), "pt") as fh:
        assert sorted(fh.keys()) == ["kv", "positions", "token_ids"]
        n_layers = fh.get_tensor("kv").shape[0]
    _, tensors = read_pack(env["pack"])
    assert sorted(tensors) == sorted(
        ["positions", "token_ids"] + [f"layers.{i}.{x}" for i in range(n_layers) for x in ("keys", "values")]
    )
    model = env["model"]
    stacked = load_pack(env["pack"], model)
    old = tmp_path / "v1"
    shutil.copytree(env["pack"], old)
    _rewrite(old, {k: v.clone() for k, v in tensors.items()}, schema_version=1, kv_layout=None)
    assert "kv_layout" not in json.loads((old / "manifest.json").read_text())
    v1 = load_pack(old, model)
    assert all(
        torch.equal(a, b)
        for a, b in zip((*v1.state.keys, *v1.state.values), (*stacked.state.keys, *stacked.state.values))
    )
    assert torch.equal(_next_logits(model, v1.cache(model)), _next_logits(model, stacked.cache(model)))


def test_non_finite_and_unknown_layout_packs_are_refused_in_one_line(env, tmp_path):
    """A NaN in the tensor file: the checksum refuses it; with the checksum fixed up, the finite check
    that runs on every load refuses it (both layouts). An unknown kv_layout is refused."""
    import shutil

    from kvbridge.errors import StateError

    _, tensors = read_pack(env["pack"])
    kv = torch.stack(
        [
            torch.stack((tensors[f"layers.{i}.keys"], tensors[f"layers.{i}.values"]))
            for i in range(len(tensors) // 2 - 1)
        ]
    )
    kv[-1, 1, 0, 0, -1, 0] = float("nan")
    raw = tmp_path / "raw"
    shutil.copytree(env["pack"], raw)
    manifest = (raw / "manifest.json").read_text()
    _rewrite(raw, {"kv": kv, "token_ids": tensors["token_ids"], "positions": tensors["positions"]})
    (raw / "manifest.json").write_text(manifest)  # the old checksum: the NaN file is refused by it
    with pytest.raises(ArtifactError, match="checksum mismatch") as info:
        load_pack(raw, env["model"])
    assert "\n" not in info.value.one_line()
    fixed = tmp_path / "fixed"
    shutil.copytree(env["pack"], fixed)
    _rewrite(fixed, {"kv": kv, "token_ids": tensors["token_ids"], "positions": tensors["positions"]})
    with pytest.raises(StateError, match=r"pack .*fixed layer \d+ values has 1 NaN/inf values") as info:
        load_pack(fixed, env["model"])
    assert "\n" not in info.value.one_line()
    per_layer = tmp_path / "per-layer"  # the same NaN in a schema 1 pack
    shutil.copytree(env["pack"], per_layer)
    bad = dict(tensors, **{f"layers.{len(kv) - 1}.values": kv[-1, 1].clone()})
    _rewrite(per_layer, {k: v.clone() for k, v in bad.items()}, schema_version=1, kv_layout=None)
    with pytest.raises(StateError, match=r"layer \d+ values has 1 NaN/inf values"):
        load_pack(per_layer, env["model"])
    odd = tmp_path / "odd"
    shutil.copytree(env["pack"], odd)
    manifest = json.loads((odd / "manifest.json").read_text())
    (odd / "manifest.json").write_text(json.dumps(dict(manifest, kv_layout="rows")))
    with pytest.raises(ArtifactError, match="kv_layout 'rows' is not one of stacked, layers"):
        load_pack(odd, env["model"])


# -- refusals -------------------------------------------------------------------------------------
def _refused(env, model, field, **kw):
    with pytest.raises(PackMismatchError) as info:
        load_pack(env["pack"], model, **kw)
    assert field in info.value.fields, info.value.one_line()
    assert f"{field} differs" in info.value.one_line() and "\n" not in info.value.one_line()
    return info.value


def test_other_weights_are_refused_and_force_loads_loudly(env, make_model):
    other = make_model(env["tok"], seed=1)
    err = _refused(env, other, "weights")
    assert "--force" in err.one_line()
    with pytest.warns(PackForceWarning, match="NOT the exact prefix state"):
        pack = load_pack(env["pack"], other, force=True)
    assert pack.forced and pack.state.approximate and [m.field for m in pack.mismatches] == ["weights"]


def test_other_tokenizer_is_refused(env, tmp_path, tiny_llama):
    other = tiny_llama.tokenizer(vocab_size=280)
    other.save_pretrained(tmp_path)
    _refused(env, env["model"], "tokenizer", tokenizer=load_tokenizer(tmp_path), tokenizer_dir=tmp_path)


def test_other_dtype_is_refused(env, make_model):
    model = make_model(env["tok"]).to(torch.bfloat16)
    err = _refused(env, model, "dtype")
    assert "float32" in err.one_line() and "bfloat16" in err.one_line()


def test_other_rope_configuration_is_refused_even_with_force(env, make_model):
    model = make_model(env["tok"], rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    err = _refused(env, model, "rope", force=True)
    assert "rope cannot be forced" in err.one_line() or "cannot be forced" in err.one_line()


def test_other_model_is_refused(env):
    from transformers import AutoModelForCausalLM, GPT2Config

    gpt2 = AutoModelForCausalLM.from_config(
        GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=len(env["tok"]))
    ).eval()
    err = _refused(env, gpt2, "model", force=True)
    assert "model_type" in err.one_line()


def test_other_cache_format_is_refused(env, tmp_path):
    import shutil

    copy = tmp_path / "pack"
    shutil.copytree(env["pack"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["cache_format"]["layout"] = "batch,tokens,kv_heads,head_dim"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackMismatchError, match="cache_format differs") as info:
        load_pack(copy, env["model"], force=True)
    assert info.value.fields == ("cache_format",)


def test_truncated_and_corrupt_files_are_refused_by_checksum(env, tmp_path):
    import shutil

    for damage in ("truncate", "flip"):
        copy = tmp_path / damage
        shutil.copytree(env["pack"], copy)
        data = bytearray((copy / "kv.safetensors").read_bytes())
        if damage == "truncate":
            data = data[: len(data) - 100]
        else:
            data[-5] ^= 0xFF
        (copy / "kv.safetensors").write_bytes(bytes(data))
        with pytest.raises(ArtifactError, match="checksum mismatch"):
            load_pack(copy, env["model"], force=True)
        with pytest.raises(ArtifactError, match="checksum mismatch"):
            read_pack(copy)


def test_guide_longer_than_positions_and_empty_guide_write_nothing(env, tmp_path, make_model, tiny_guide):
    model = make_model(env["tok"], max_position_embeddings=16)
    with pytest.raises(KVBridgeError, match="has 16 positions"):
        save_pack(model, tmp_path / "long", guide_text=tiny_guide * 2, tokenizer=env["tok"])
    with pytest.raises(SplitError, match="guide is empty"):
        save_pack(env["model"], tmp_path / "empty", guide_text="   ", tokenizer=env["tok"])
    assert list(tmp_path.iterdir()) == []


def test_existing_pack_is_not_overwritten(env, tiny_guide):
    with pytest.raises(ArtifactError, match="already exists"):
        save_pack(env["model"], env["pack"], guide_text=tiny_guide, tokenizer=env["tok"])


def test_pack_with_real_gpt2_tokenizer_files(shared_dir, tmp_path, tiny_llama):
    """Tokenizer fingerprint from the published vocab.json + merges.txt; ids clamped to a small model."""
    from transformers import AutoModelForCausalLM, GPT2Config

    tok = load_tokenizer(shared_dir / "fixtures/tokenizers/gpt2")
    model = AutoModelForCausalLM.from_config(
        GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=len(tok))
    ).eval()
    folder = tiny_llama.save(tmp_path / "gpt2", model, tok)
    out = save_pack(model, tmp_path / "pack", guide_text="Hello there, friend.", tokenizer=tok, model_dir=folder)
    manifest, _ = read_pack(out)
    assert manifest["positional"]["kind"] == "absolute" and manifest["cache_format"]["keys"] == "no_rotation"
    assert manifest["tokenizer"]["fingerprint"] and manifest["tokenizer"]["vocab_size"] == 50257
    counter = ForwardCounter(model)
    try:
        pack = load_pack(out, model, tokenizer=tok, tokenizer_dir=folder)
        pack.cache(model)
    finally:
        counter.remove()
    assert counter.calls == 0 and pack.guide_ids == encode(tok, "Hello there, friend.", add_special_tokens=True)
