"""The one loader: every transformers load goes through it, with ``trust_remote_code=False``, and
``auto_map`` folders are refused naming the entry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import kvbridge
from kvbridge.models import hf_loader

SRC = Path(kvbridge.__file__).resolve().parent
#: transformers loaders that can run code named by a model folder or config
LOADER_CALL = re.compile(r"\b(from_pretrained|for_model|from_config)\(")


def test_no_transformers_loader_is_called_outside_the_one_loader():
    bad = []
    for path in SRC.rglob("*.py"):
        if path.name == "hf_loader.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if (
                LOADER_CALL.search(code)
                and "``" not in code
                and "model_from_config(" not in code
                and not re.search(r"\b_from_config\(|def from_config\(", code)
            ):
                bad.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert not bad, "load through kvbridge.models.hf_loader:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "name,data,entry",
    [
        (
            "config.json",
            {"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "m.X"}},
            "AutoModelForCausalLM -> m.X",
        ),
        ("tokenizer_config.json", {"auto_map": {"AutoTokenizer": [None, "t.Fast"]}}, "AutoTokenizer -> t.Fast"),
        ("processor_config.json", {"auto_map": {"AutoProcessor": "p.P"}}, "AutoProcessor -> p.P"),
        ("config.json", {"model_type": "x", "text_config": {"auto_map": {"AutoConfig": "c.C"}}}, "AutoConfig -> c.C"),
    ],
)
def test_refuse_remote_code_names_the_entry(tmp_path, name, data, entry):
    (tmp_path / name).write_text(json.dumps(data))
    with pytest.raises(hf_loader.RemoteCodeError) as info:
        hf_loader.refuse_remote_code(tmp_path)
    line = info.value.one_line()
    assert entry in line and name in line and "\n" not in line


def test_folders_without_code_pointers_pass(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": {}}))
    (tmp_path / "tokenizer_config.json").write_text("not json")
    hf_loader.refuse_remote_code(tmp_path)
    hf_loader.refuse_remote_code(tmp_path / "missing")


def test_every_load_passes_trust_remote_code_false(tmp_path, monkeypatch):
    import transformers

    seen = []

    def record(kind):
        def fake(*args, **kwargs):
            seen.append((kind, kwargs))
            return kind

        return fake

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", record("model"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", record("tokenizer"))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", record("config"))
    hf_loader.model_from_pretrained(tmp_path, trust_remote_code=True)
    hf_loader.tokenizer_from_pretrained(tmp_path, gguf_file="x.gguf")
    hf_loader.model_from_config(transformers.LlamaConfig(), trust_remote_code=True)
    assert [k for k, _ in seen] == ["model", "tokenizer", "config"]
    assert all(kw["trust_remote_code"] is False for _, kw in seen)
    assert all(kw["local_files_only"] is True for k, kw in seen if k != "config")


def test_config_for_model_drops_the_code_pointer():
    obj = hf_loader.config_for_model("llama", num_hidden_layers=1, auto_map={"AutoModelForCausalLM": "m.X"})
    assert not getattr(obj, "auto_map", None)
