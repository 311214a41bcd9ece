"""Weight fingerprints cover every byte; the per-file cache is keyed by path, size and mtime."""

from __future__ import annotations

import hashlib
import json
import os

from kvbridge.models import fingerprint as fp


def test_file_sha256_is_the_whole_file_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path / "home"))
    f = tmp_path / "w.safetensors"
    f.write_bytes(os.urandom(3 << 20))
    assert fp.file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()
    cache = json.loads((tmp_path / "home" / fp.CACHE_FILE).read_text())
    (key,) = cache
    cache[key] = "0" * 64  # a planted value proves the cache is read on a hit ...
    (tmp_path / "home" / fp.CACHE_FILE).write_text(json.dumps(cache))
    assert fp.file_sha256(f) == "0" * 64
    os.utime(f, ns=(os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns + 1_000_000))
    assert fp.file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()  # ... and a new mtime re-hashes
    monkeypatch.setenv("KVBRIDGE_NO_CACHE", "1")
    assert fp.file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()


def test_one_middle_byte_changes_the_digest_of_a_large_folder(tmp_path, monkeypatch):
    """The old fingerprint read only the first and last 4 MiB of big files: a middle edit went unseen."""
    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path / "home"))
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    data = bytearray(os.urandom(12 << 20))
    (a / "model.safetensors").write_bytes(data)
    data[6 << 20] ^= 1
    (b / "model.safetensors").write_bytes(data)
    assert fp.weights_digest(a) != fp.weights_digest(b)
    assert fp.weights_digest(tmp_path / "home") is None


def test_check_never_calls_a_middle_edit_identity(tmp_path, monkeypatch):
    import shutil

    from kvbridge.models.compat import check_models
    from kvbridge.zoo import model_dir

    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path / "home"))
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(model_dir("base"), a)
    shutil.copytree(model_dir("base"), b)
    raw = bytearray((b / "model.safetensors").read_bytes())
    raw[len(raw) // 2] ^= 0x10
    (b / "model.safetensors").write_bytes(raw)
    assert check_models(str(a), str(b)).verdict != "identity"
    shutil.copy(a / "model.safetensors", b / "model.safetensors")
    assert check_models(str(a), str(b)).verdict == "identity"


def test_config_fingerprint_ignores_bookkeeping():
    base = {"model_type": "llama", "hidden_size": 8}
    assert fp.config_fingerprint(base) == fp.config_fingerprint(dict(base, _name_or_path="x", dtype="bfloat16"))
    assert fp.config_fingerprint(base) != fp.config_fingerprint(dict(base, hidden_size=16))


def test_weights_fingerprint_is_memoised_and_sees_every_change():
    """Computed once per model; an in-place edit, a replaced parameter, a cast and forget() re-hash,
    and every re-hash equals a fresh hash of a copy with the same weights."""
    import copy

    import torch

    from kvbridge.models import fingerprint as fp
    from kvbridge.plugins import make_host

    adapter = make_host(entry_points=False).adapter_for({"model_type": "llama"})
    model = adapter.build_model(adapter.tiny_config(), seed=0)

    def fresh(m):  # the same weights in a model that has no memo
        twin = copy.deepcopy(m)
        fp.forget_weights_fingerprint(twin)
        return fp.weights_fingerprint(twin)

    first = fp.weights_fingerprint(model)
    calls = []
    real = model.state_dict
    model.state_dict = lambda *a, **k: calls.append(1) or real(*a, **k)
    assert fp.weights_fingerprint(model) == first and not calls  # memo: no state dict, no hashing
    del model.state_dict

    weight = model.model.layers[0].self_attn.k_proj.weight
    with torch.no_grad():
        weight.mul_(2)  # in place: the version counter moves
    edited = fp.weights_fingerprint(model)
    assert edited != first and edited == fresh(model)

    model.model.layers[0].self_attn.k_proj.weight = torch.nn.Parameter(weight.detach() / 2)  # a new object
    assert fp.weights_fingerprint(model) == first == fresh(model)

    model.to(torch.bfloat16)
    cast = fp.weights_fingerprint(model)
    assert cast != first and cast == fresh(model)

    weight = model.model.layers[0].self_attn.k_proj.weight
    weight.data.mul_(3)  # through .data the version counter does not move: forget() is the way
    fp.forget_weights_fingerprint(model)
    assert fp.weights_fingerprint(model) == fresh(model) != cast


def test_model_config_fingerprint_is_memoised_and_sees_every_change(monkeypatch):
    """Computed once per model; a changed attribute, a dict changed in place, a replaced config and a
    nested config re-compute, and every answer equals config_fingerprint(config.to_dict())."""
    import copy

    from kvbridge.plugins import make_host

    adapter = make_host(entry_points=False).adapter_for({"model_type": "llama"})
    model = adapter.build_model(adapter.tiny_config(), seed=0)

    def fresh(m):
        return fp.config_fingerprint(m.config.to_dict())

    first = fp.model_config_fingerprint(model)
    assert first == fresh(model)
    calls = []
    real = type(model.config).to_dict
    monkeypatch.setattr(type(model.config), "to_dict", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    assert fp.model_config_fingerprint(model) == first and not calls  # memo: no to_dict
    monkeypatch.undo()

    eps = model.config.rms_norm_eps
    model.config.rms_norm_eps = eps * 2  # an attribute set
    changed = fp.model_config_fingerprint(model)
    assert changed != first and changed == fresh(model)
    model.config.rms_norm_eps = eps  # back: the first answer again
    assert fp.model_config_fingerprint(model) == first

    model.config.rope_parameters["rope_theta"] *= 2  # a dict changed in place, no attribute set
    in_place = fp.model_config_fingerprint(model)
    assert in_place != first and in_place == fresh(model)

    other = copy.deepcopy(model.config)
    other.num_hidden_layers += 1
    model.config = other  # a replaced config object
    assert fp.model_config_fingerprint(model) == fresh(model) != in_place

    # weights do not enter the config fingerprint: a weight change keeps it (its own memo re-hashes)
    before = fp.model_config_fingerprint(model)
    import torch

    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(2)
    assert fp.model_config_fingerprint(model) == before


def test_model_config_fingerprint_sees_a_nested_config_change():
    from transformers import AutoConfig

    class Holder:  # a model-like object: only .config is read
        pass

    holder = Holder()
    holder.config = AutoConfig.for_model("llava", text_config={"model_type": "llama", "hidden_size": 64})
    first = fp.model_config_fingerprint(holder)
    holder.config.text_config.hidden_size = 128  # a nested config changed in place
    assert fp.model_config_fingerprint(holder) == fp.config_fingerprint(holder.config.to_dict()) != first


def test_tokenizer_identity_is_memoised_per_tokenizer_state(tmp_path):
    from kvbridge.models import fingerprint as fp

    tok = _tiny_tokenizer(tmp_path)
    first = fp.tokenizer_identity(tok)
    assert fp.tokenizer_identity(tok) == first
    tok.add_tokens(["<kvbridge-new-token>"])
    assert fp.tokenizer_identity(tok)["fingerprint"] != first["fingerprint"]


def _tiny_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "a": 1, "b": 2, "ab": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
