"""Model references -> configs (kvbridge.check.sources) and tokenizer fingerprints (kvbridge.check.tokenizer_fp)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import importlib

models_resolve = importlib.import_module("kvbridge.models.resolve")
from kvbridge.check import sources, tokenizer_fp
from kvbridge.errors import ConfigError, KVBridgeError, UnsupportedModelError
from kvbridge.plugins import make_host


pytestmark = pytest.mark.usefixtures("isolated_env")


@pytest.fixture
def tokenizers(shared_dir) -> Path:
    return shared_dir / "fixtures" / "tokenizers"


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


# -- paths --------------------------------------------------------------------------------------
def test_model_folder(configs, host):
    m = models_resolve.resolve(str(configs / "meta-llama__Llama-3.2-1B"), host=host)
    assert m.kind == "dir" and m.name == "meta-llama__Llama-3.2-1B"
    assert m.config["model_type"] == "llama" and m.path.endswith("config.json")
    assert m.generation_config is not None  # generation_config.json beside it
    assert m.tokenizer_files == () and m.tokenizer() is None
    assert m.spec(host).num_layers == 16


def test_config_json_path(configs, host):
    m = models_resolve.resolve(str(configs / "openai-community__gpt2" / "config.json"), host=host)
    assert m.kind == "config" and m.config["n_layer"] == 12


def test_save_pretrained_folder_with_tokenizer(tmp_path, configs, tokenizers, host):
    folder = tmp_path / "qwen"
    folder.mkdir()
    shutil.copy(configs / "Qwen__Qwen2.5-0.5B" / "config.json", folder)
    for f in (tokenizers / "qwen2.5").iterdir():
        shutil.copy(f, folder)
    m = models_resolve.resolve(str(folder), host=host)
    assert {Path(p).name for p in m.tokenizer_files} == {"vocab.json", "merges.txt", "tokenizer_config.json"}
    assert m.tokenizer() == tokenizer_fp.fingerprint_dir(tokenizers / "qwen2.5")


def test_manifest_record_file_is_a_reference(host, repo_root):
    path = repo_root / "src" / "kvbridge" / "manifests" / "models" / "Qwen__Qwen2.5-0.5B.json"
    m = models_resolve.resolve(str(path), host=host)
    assert m.kind == "manifest" and m.name == "Qwen/Qwen2.5-0.5B"


# -- the local HF cache -------------------------------------------------------------------------------
def _fake_cache(root: Path, repo_id: str, config: dict, commit: str = "0123abcd" * 5) -> Path:
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snap


def test_hf_cache_hit_wins_over_manifest(tmp_path, monkeypatch, configs, host):
    cfg = json.loads((configs / "Qwen__Qwen2.5-0.5B" / "config.json").read_text())
    snap = _fake_cache(tmp_path / "hub", "Qwen/Qwen2.5-0.5B", cfg)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    m = models_resolve.resolve("Qwen/Qwen2.5-0.5B", host=host)
    assert m.kind == "hf-cache" and m.folder == str(snap) and m.name == "Qwen/Qwen2.5-0.5B"
    assert models_resolve.resolve("Qwen/Qwen2.5-0.5B@0123ab", host=host).kind == "hf-cache"
    assert "Qwen/Qwen2.5-0.5B" in models_resolve.cached_hub_ids()


def test_hf_home_fallback(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert models_resolve.hf_cache_dir() == tmp_path / "hfhome" / "hub"


def test_no_cache_means_manifest(host):
    m = models_resolve.resolve("Qwen/Qwen2.5-0.5B", host=host)
    assert m.kind == "manifest" and m.tokenizer_record is not None


# -- manifests ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("ref", ["Qwen/Qwen2.5-0.5B", "qwen/qwen2.5-0.5b", "qwen2.5-0.5b", "Qwen2.5-0.5B"])
def test_manifest_names_and_aliases(ref, host):
    assert models_resolve.resolve(ref, host=host).name == "Qwen/Qwen2.5-0.5B"


def test_unknown_name_suggests(host):
    with pytest.raises(ConfigError) as info:
        models_resolve.resolve("Qwen/Qwen2.5-0.6B", host=host)
    text = one_line(info.value)
    assert "unknown model 'Qwen/Qwen2.5-0.6B'" in text and "did you mean" in text
    assert "Qwen/Qwen2.5-0.5B" in text
    assert info.value.exit_code == 2


def test_manifest_path_env(tmp_path, monkeypatch, host):
    folder = tmp_path / "extra"
    folder.mkdir()
    record = {
        "id": "acme/tiny-llama",
        "family": "llama",
        "source": "test",
        "config": {
            "model_type": "llama",
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "hidden_size": 64,
            "num_key_value_heads": 2,
        },
    }
    (folder / "acme.json").write_text(json.dumps({"models": [record]}))
    monkeypatch.setenv("KVBRIDGE_MANIFEST_PATH", str(folder))
    m = models_resolve.resolve("acme/tiny-llama", host=host)
    assert m.kind == "manifest" and m.spec(host).num_kv_heads == 2


def test_plugin_manifest_dirs_hook(tmp_path, host):
    """Plugins publish folders through kvbridge_manifest_dirs (when the host defines the hook)."""
    if not hasattr(host.pm.hook, "kvbridge_manifest_dirs"):
        pytest.skip("this kvbridge has no kvbridge_manifest_dirs hook")
    from kvbridge.hookspecs import hookimpl

    folder = tmp_path / "plug"
    folder.mkdir()
    (folder / "m.json").write_text(
        json.dumps(
            {
                "id": "acme/plugged",
                "family": "gpt2",
                "source": "t",
                "config": {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32},
            }
        )
    )

    class Plugin:
        @hookimpl
        def kvbridge_manifest_dirs(self):
            return [folder]

    h = make_host(entry_points=False, extra=[("plug", Plugin())])
    assert "acme/plugged" in sources.load_manifests(h)


@pytest.mark.parametrize(
    "record,needle",
    [
        ({"family": "llama", "source": "x", "config": {"model_type": "llama"}}, "'id' is missing"),
        ({"id": "a/b", "family": "llama", "source": "x", "config": {}}, "config.model_type"),
        (
            {"id": "a/b", "family": "llama", "source": "x", "config": {"model_type": "llama"}, "geometri": {}},
            "did you mean 'geometry'",
        ),
        ({"id": "a/b", "family": "llama", "source": "x", "config": {"model_type": "llama"}, "aliases": "x"}, "aliases"),
    ],
)
def test_bad_manifest_records(record, needle, tmp_path):
    with pytest.raises(ConfigError) as info:
        sources.validate_manifest(record, tmp_path / "m.json")
    text = one_line(info.value)
    assert needle in text and "m.json" in text


def test_broken_manifest_file_names_it(tmp_path):
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ConfigError) as info:
        sources.load_manifests(dirs=[tmp_path])
    assert "bad.json" in one_line(info.value) and "not valid JSON" in str(info.value)


# -- bad input: one line naming the file and the field, exit 2 ---------------------------------------------
def test_non_json_file(tmp_path, host):
    bad = tmp_path / "config.json"
    bad.write_text("model_type: llama\n")
    with pytest.raises(ConfigError) as info:
        models_resolve.resolve(str(bad), host=host)
    text = one_line(info.value)
    assert str(bad) in text and "not valid JSON" in text and "line 1" in text
    assert info.value.exit_code == 2


def test_binary_file(tmp_path, host):
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"\x80\x81\xff\x00" * 10)
    with pytest.raises(ConfigError) as info:
        models_resolve.resolve(str(bad), host=host)
    assert str(bad) in one_line(info.value)


def test_json_not_an_object(tmp_path, host):
    bad = tmp_path / "config.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError) as info:
        models_resolve.resolve(str(bad), host=host)
    assert "expected a JSON object" in one_line(info.value) and "list" in str(info.value)


def test_dir_without_config(tmp_path, host):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError) as info:
        models_resolve.resolve(str(tmp_path), host=host)
    text = one_line(info.value)
    assert str(tmp_path) in text and "no config.json" in text and "model.safetensors" in text


def test_missing_path(host):
    with pytest.raises(ConfigError) as info:
        models_resolve.resolve("./nowhere/config.json", host=host)
    assert "no such file" in one_line(info.value)


def _write(tmp_path, cfg) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_missing_num_attention_heads(tmp_path, configs, host):
    cfg = json.loads((configs / "meta-llama__Llama-3.2-1B" / "config.json").read_text())
    del cfg["num_attention_heads"]
    m = models_resolve.resolve(_write(tmp_path, cfg), host=host)
    with pytest.raises(ConfigError) as info:
        m.spec(host)
    text = one_line(info.value)
    assert m.path in text and "num_attention_heads" in text


def test_negative_layer_count(tmp_path, configs, host):
    cfg = json.loads((configs / "Qwen__Qwen2.5-0.5B" / "config.json").read_text())
    cfg["num_hidden_layers"] = -2
    m = models_resolve.resolve(_write(tmp_path, cfg), host=host)
    with pytest.raises(ConfigError) as info:
        m.spec(host)
    text = one_line(info.value)
    assert m.path in text and "num_hidden_layers" in text and "-2" in text


def test_model_without_kv_cache(tmp_path, host):
    m = models_resolve.resolve(
        _write(tmp_path, {"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24}), host=host
    )
    with pytest.raises(UnsupportedModelError) as info:
        m.spec(host)
    text = one_line(info.value)
    assert m.path in text and "'model_type'" in text and "no attention KV cache" in text
    assert info.value.exit_code == 2


def test_missing_model_type(tmp_path, host):
    m = models_resolve.resolve(_write(tmp_path, {"hidden_size": 8}), host=host)
    with pytest.raises(ConfigError) as info:
        m.spec(host)
    assert "'model_type' is missing" in one_line(info.value) and m.path in str(info.value)


def test_unknown_model_type(tmp_path, host):
    m = models_resolve.resolve(_write(tmp_path, {"model_type": "not_a_real_arch", "hidden_size": 8}), host=host)
    with pytest.raises(KVBridgeError) as info:
        m.spec(host)
    text = one_line(info.value)
    assert "not_a_real_arch" in text and m.path in text and info.value.exit_code == 2


def test_mla_config_is_described_by_the_generic_adapter(configs, host):
    spec = models_resolve.resolve(str(configs / "deepseek-ai__DeepSeek-V2-Lite"), host=host).spec(host)
    assert spec.family == "generic" and spec.cache_format == "mla" and spec.dtype == "bfloat16"
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.value_head_dim) == (27, 1, 512, 64)


def test_multimodal_wrapper_uses_text_config(tmp_path, host):
    text = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    m = models_resolve.resolve(_write(tmp_path, {"model_type": "some_vlm", "text_config": text}), host=host)
    assert m.spec(host).model_type == "llama"


# -- tokenizer fingerprints -----------------------------------------------------------------------------------
def test_fingerprint_formats_agree(tmp_path, tokenizers):
    """vocab.json + merges.txt and an equivalent tokenizer.json give the same ids fingerprint."""
    gpt2 = tokenizer_fp.fingerprint_dir(tokenizers / "gpt2")
    assert gpt2.kind == "bpe" and gpt2.vocab_size == 50257 and gpt2.rules_format == "merges"
    vocab = json.loads((tokenizers / "gpt2" / "vocab.json").read_text(encoding="utf-8"))
    merges = (tokenizers / "gpt2" / "merges.txt").read_text(encoding="utf-8").split("\n")[1:]
    merges = [m for m in merges if m]
    tj = {
        "version": "1.0",
        "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "special": True}],
        "model": {"type": "BPE", "vocab": vocab, "merges": [m.split(" ") for m in merges]},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    other = tokenizer_fp.fingerprint_dir(tmp_path)
    assert (other.base, other.vocab, other.rules) == (gpt2.base, gpt2.vocab, gpt2.rules)
    assert other.digest == gpt2.digest
    assert tokenizer_fp.compare(gpt2, other)[0] == "same"


def test_merges_header_is_ignored(tmp_path, tokenizers):
    src = tokenizers / "gpt2"
    shutil.copy(src / "vocab.json", tmp_path)
    lines = (src / "merges.txt").read_text(encoding="utf-8").split("\n")
    assert lines[0].startswith("#version")
    (tmp_path / "merges.txt").write_text("\n".join(lines[1:]), encoding="utf-8")
    assert tokenizer_fp.fingerprint_dir(tmp_path).rules == tokenizer_fp.fingerprint_dir(src).rules


def test_sentencepiece_model_is_parsed(tokenizers):
    sp = tokenizer_fp.parse_sentencepiece(tokenizers / "llama2-sentencepiece" / "tokenizer.model")
    assert len(sp["pieces"]) == 32000
    assert [p[0] for p in sp["pieces"][:3]] == ["<unk>", "<s>", "</s>"]
    assert sp["model_type"] == "bpe" and (sp["bos_id"], sp["eos_id"]) == (1, 2)


def test_mistral_tokenizer_json_and_model_share_the_vocab(tokenizers):
    tj = tokenizer_fp.fingerprint_files([tokenizers / "mistral" / "tokenizer.json"])
    sp = tokenizer_fp.fingerprint_files([tokenizers / "mistral" / "tokenizer.model"])
    assert tj.vocab == sp.vocab and tj.rules_format != sp.rules_format
    verdict, action = tokenizer_fp.compare(tj, sp)
    assert verdict == "same" and "not comparable" in action


def test_llama2_and_mistral_differ(tokenizers):
    llama = tokenizer_fp.fingerprint_dir(tokenizers / "llama2-sentencepiece")
    mistral = tokenizer_fp.fingerprint_files([tokenizers / "mistral" / "tokenizer.model"])
    assert llama.vocab_size == mistral.vocab_size == 32000
    assert tokenizer_fp.compare(llama, mistral)[0] == "blocking"


def test_added_tokens_and_bos_roles(tmp_path, tokenizers):
    base = tokenizer_fp.fingerprint_dir(tokenizers / "qwen2.5")
    folder = tmp_path / "q"
    shutil.copytree(tokenizers / "qwen2.5", folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"]["151665"] = {"content": "<think>", "special": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    more = tokenizer_fp.fingerprint_dir(folder)
    assert more.base == base.base and more.vocab != base.vocab
    assert tokenizer_fp.compare(base, more)[0] == "mappable"
    cfg["added_tokens_decoder"].pop("151665")
    cfg["add_bos_token"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    verdict, action = tokenizer_fp.compare(base, tokenizer_fp.fingerprint_dir(folder))
    assert verdict == "mappable" and "BOS" in action
    cfg["add_bos_token"] = False
    cfg["eos_token"] = "<|im_end|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    verdict, action = tokenizer_fp.compare(base, tokenizer_fp.fingerprint_dir(folder))
    assert verdict == "same" and "eos_token" in action


def test_fingerprint_round_trips_and_caches(tmp_path, monkeypatch, tokenizers):
    fp = tokenizer_fp.fingerprint_dir(tokenizers / "gpt2")
    assert tokenizer_fp.TokenizerFingerprint.from_dict(fp.to_dict()) == fp
    monkeypatch.setattr(tokenizer_fp, "_fingerprint", lambda paths: (_ for _ in ()).throw(AssertionError("miss")))
    assert tokenizer_fp.fingerprint_dir(tokenizers / "gpt2") == fp  # served from KVBRIDGE_CACHE_DIR


def test_tampered_fingerprint_record(tokenizers):
    data = tokenizer_fp.fingerprint_dir(tokenizers / "gpt2").to_dict()
    data["vocab"] = "0" * 64
    with pytest.raises(ConfigError):
        tokenizer_fp.TokenizerFingerprint.from_dict(data)


def test_bad_tokenizer_files(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"\xff\xff\xff")
    with pytest.raises(ConfigError) as info:
        tokenizer_fp.fingerprint_files([tmp_path / "tokenizer.model"], cache=False)
    assert "tokenizer.model" in one_line(info.value)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError) as info:
        tokenizer_fp.fingerprint_files([tmp_path / "tokenizer.json"], cache=False)
    assert "model.vocab" in one_line(info.value)


def test_folder_without_tokenizer():
    assert tokenizer_fp.find_tokenizer_files(Path("/nonexistent")) == ()
