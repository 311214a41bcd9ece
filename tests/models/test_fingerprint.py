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

    from kvbridge.check.compat import check_models
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
