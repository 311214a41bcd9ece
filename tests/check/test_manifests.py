"""manifests/models: schema-valid records whose geometry regenerates from their configs and the fixtures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import importlib

models_resolve = importlib.import_module("kvbridge.models.resolve")
from kvbridge.check import sources
from kvbridge.check.tokenizer_fp import fingerprint_dir

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "src" / "kvbridge" / "manifests" / "models"
SCHEMA = json.loads((REPO / "src" / "kvbridge" / "manifests" / "schemas" / "model-manifest.schema.json").read_text())
RECORDS = sorted(MODELS.glob("*.json"))


# -- a small JSON Schema validator (the subset the manifest schema uses) ---------------------------------------
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is_type(value, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def validate(value, schema: dict, root: dict, path: str = "$") -> list[str]:
    """Errors of ``value`` against ``schema`` (type, enum, required, properties, additionalProperties,
    items, minimum/maximum/exclusiveMinimum, minLength, pattern, uniqueItems, oneOf, $ref)."""
    if "$ref" in schema:
        node = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        return validate(value, node, root, path)
    errors: list[str] = []
    if "oneOf" in schema:
        ok = [s for s in schema["oneOf"] if not validate(value, s, root, path)]
        if len(ok) != 1:
            errors.append(f"{path}: matches {len(ok)} of oneOf")
        return errors
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if "type" in schema and not _is_type(value, schema["type"]):
        return errors + [f"{path}: expected {schema['type']}, got {type(value).__name__}"]
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing {key!r}")
        props = schema.get("properties", {})
        for key, item in value.items():
            if key in props:
                errors += validate(item, props[key], root, f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unexpected {key!r}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += validate(item, schema["additionalProperties"], root, f"{path}.{key}")
    if isinstance(value, list):
        if "items" in schema:
            for i, item in enumerate(value):
                errors += validate(item, schema["items"], root, f"{path}[{i}]")
        if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True) for v in value}) != len(value):
            errors.append(f"{path}: items not unique")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if _is_type(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} > {schema['maximum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            errors.append(f"{path}: {value} <= {schema['exclusiveMinimum']}")
    return errors


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# -- coverage ----------------------------------------------------------------------------------------------------
def test_at_least_20_models_across_8_families():
    records = [_load(p) for p in RECORDS]
    assert len(records) >= 20, len(records)
    assert len({r["family"] for r in records}) >= 8
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids))
    names = [n.lower() for r in records for n in [r["id"], *r.get("aliases", [])]]
    assert len(names) == len(set(names)), "an alias collides with another record"
    for path, record in zip(RECORDS, records):
        assert path.name == record["id"].replace("/", "__") + ".json"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_record_is_schema_valid(path):
    record = _load(path)
    assert validate(record, SCHEMA, SCHEMA) == []
    sources.validate_manifest(record, path)


def test_validator_is_not_vacuous():
    record = _load(MODELS / "Qwen__Qwen2.5-0.5B.json")
    broken = json.loads(json.dumps(record))
    broken["geometry"]["num_layers"] = 0
    broken["geometry"]["positional"] = "learned"
    broken["geometry"]["rope"]["theta"] = "big"
    del broken["family"]
    broken["extra"] = 1
    errors = validate(broken, SCHEMA, SCHEMA)
    assert len(errors) == 5, errors


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_geometry_regenerates_from_the_record_config(path, host):
    record = _load(path)
    spec = sources.describe_config(record["config"], where=str(path), host=host)
    assert spec.family == record["family"]
    assert sources.geometry_diff(record["geometry"], sources.spec_geometry(spec)) == []


def test_geometry_regenerates_from_every_fixture(shared_dir, host):
    """The geometry computed from each real config.json equals the record's; every supported fixture has one."""
    fixtures = shared_dir / "fixtures" / "configs"
    checked = 0
    for folder in sorted(fixtures.iterdir()):
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            continue
        config = json.loads(cfg_path.read_text())
        try:
            spec = sources.describe_config(config, where=str(cfg_path), host=host)
        except Exception as exc:  # unsupported families (MLA) have no record
            assert getattr(exc, "exit_code", None) == 2
            assert not (MODELS / f"{folder.name}.json").exists()
            continue
        record_path = MODELS / f"{folder.name}.json"
        assert record_path.is_file(), f"no manifest record for fixture {folder.name}"
        record = _load(record_path)
        assert record["source"].startswith("fixture:") and folder.name in record["source"]
        assert sources.geometry_diff(record["geometry"], sources.spec_geometry(spec)) == [], folder.name
        # fixture-sourced records carry the fixture's config whole (names dropped)
        expected = {k: v for k, v in config.items() if k not in ("_name_or_path", "auto_map")}
        assert record["config"] == expected, folder.name
        checked += 1
    assert checked >= 10


def test_tokenizer_fingerprints_match_the_fixture_files(shared_dir):
    tokenizers = shared_dir / "fixtures" / "tokenizers"
    seen = 0
    for path in RECORDS:
        record = _load(path)
        tok = record.get("tokenizer")
        if not tok:
            continue
        folder = tokenizers / tok["source"].split("fixtures/tokenizers/")[1].split("/")[0]
        assert fingerprint_dir(folder).to_dict()["digest"] == tok["digest"], path.name
        seen += 1
    assert seen >= 4


def test_readme_documents_every_field():
    readme = (REPO / "src" / "kvbridge" / "manifests" / "README.md").read_text()
    for key in SCHEMA["properties"]:
        if key != "$schema":
            assert f"`{key}`" in readme, key
    for key in SCHEMA["properties"]["geometry"]["properties"]:
        assert key in readme or key in (sources.spec_geometry.__doc__ or ""), key
    assert "kvbridge_manifest_dirs" in readme and "KVBRIDGE_MANIFEST_PATH" in readme


def test_popular_new_families_check_offline(host, monkeypatch, tmp_path):
    """`kvbridge check Qwen/Qwen3-30B-A3B Qwen/Qwen3-32B` answers from the manifests alone."""
    from click.testing import CliRunner

    from kvbridge.cli.main import cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache: only the manifests can answer
    result = CliRunner().invoke(cli, ["check", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-32B", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{") :])
    assert data["verdict"] == "mappable"
    assert (data["source"]["num_layers"], data["source"]["num_kv_heads"], data["source"]["dtype"]) == (
        48,
        4,
        "bfloat16",
    )
    assert data["source"]["family"] == "generic" and data["target"]["family"] == "qwen3"
    for mid, family in (
        ("openai/gpt-oss-20b", "generic"),
        ("google/gemma-3-27b-it", "gemma3_text"),
        ("deepseek-ai/DeepSeek-V3", "generic"),
        ("mistralai/Mixtral-8x7B-v0.1", "generic"),
    ):
        spec = models_resolve.resolve(mid, host=host).spec(host)
        assert spec.family == family and spec.dtype == "bfloat16", mid


def _check_json(*ids):
    from click.testing import CliRunner

    from kvbridge.cli.main import cli

    result = CliRunner().invoke(cli, ["check", *ids, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{") :])
    return data, {a["name"]: a for a in data["axes"]}


def test_nope_chunked_and_sliding_families_are_recorded(host):
    """SmolLM3 and Llama 4 skip RoPE on every 4th layer; Llama 4 chunks its other layers (8192);
    OLMo 3 slides (4096) on 3 of every 4 layers, YaRN only on its full layers."""
    geo = {p.stem: _load(p)["geometry"] for p in RECORDS}
    assert geo["HuggingFaceTB__SmolLM3-3B"]["nope_layers"] == list(range(3, 36, 4))
    assert geo["HuggingFaceTB__SmolLM3-3B"]["rope"]["theta"] == 5e6
    for name in ("meta-llama__Llama-4-Scout-17B-16E-Instruct", "meta-llama__Llama-4-Maverick-17B-128E-Instruct"):
        g = geo[name]
        assert g["nope_layers"] == g["full_attention_layers"] == list(range(3, 48, 4)), name
        assert (g["attention_chunk_size"], g["num_kv_heads"], g["head_dim"], g["dtype"]) == (8192, 8, 128, "bfloat16")
    assert geo["meta-llama__Llama-4-Scout-17B-16E-Instruct"]["rope"]["type"] == "llama3"
    for name, layers, kv in (("allenai__Olmo-3-1025-7B", 32, 32), ("allenai__Olmo-3-1125-32B", 64, 8)):
        g = geo[name]
        assert (g["num_layers"], g["num_kv_heads"], g["sliding_window"]) == (layers, kv, 4096)
        assert g["full_attention_layers"] == list(range(3, layers, 4)) and "nope_layers" not in g
        assert g["rope_by_layer_type"]["full_attention"]["type"] == "yarn"
        assert g["rope_by_layer_type"]["sliding_attention"]["type"] == "default"


def test_check_reports_per_layer_differences_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache: only the manifests can answer
    data, axes = _check_json("HuggingFaceTB/SmolLM3-3B", "meta-llama/Llama-3.2-3B-Instruct")
    assert data["verdict"] == "mappable" and axes["rope"]["verdict"] == "mappable"
    assert (
        "NoPE layers differ (source layers [3, 7, 11, 15, 19, 23, 27, 31, 35], target none)" in axes["rope"]["action"]
    )
    assert (axes["layers"]["source"], axes["layers"]["target"]) == (36, 28)

    data, axes = _check_json("meta-llama/Llama-4-Scout-17B-16E-Instruct", "HuggingFaceTB/SmolLM3-3B")
    assert "layers [39, 43, 47] are NoPE only in the source" in axes["rope"]["action"]
    assert axes["attention"]["source"] == "hybrid 36 chunked 8192 + 12 full"
    assert axes["attention"]["verdict"] == "mappable"

    data, axes = _check_json(
        "meta-llama/Llama-4-Scout-17B-16E-Instruct", "meta-llama/Llama-4-Maverick-17B-128E-Instruct"
    )
    assert axes["attention"]["verdict"] == "same" and "8192" in axes["attention"]["action"]
    assert axes["layers"]["verdict"] == "same" and axes["rope"]["verdict"] == "mappable"  # llama3 x16 vs plain

    data, axes = _check_json("allenai/Olmo-3-1025-7B", "HuggingFaceTB/SmolLM3-3B")
    assert axes["attention"]["source"] == "hybrid 24 sliding 4096 + 8 full" and axes["attention"]["target"] == "full"
    assert "NoPE only in the target" in axes["rope"]["action"]
    data, axes = _check_json("allenai/Olmo-3-1025-7B", "allenai/Olmo-3-1125-32B")
    assert axes["attention"]["verdict"] == "same" and axes["kv_heads"]["target"] == 8
