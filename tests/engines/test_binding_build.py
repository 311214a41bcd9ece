"""The Makefile's llama.cpp binding build: one pinned wheel, cached, and the cache handed to the
nested fresh-clone run (tests/test_fresh_machine.py strips KVBRIDGE_* but keeps LLAMA_CPP_WHEELS),
so a CI run builds llama.cpp at most once."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or not (REPO / "Makefile").is_file(), reason="needs make and the repository's Makefile"
)


def _make(args, env, tmp_path):
    extra = tmp_path / "extra.mk"
    extra.write_text('showenv:\n\t@echo "LLAMA_CPP_WHEELS=$$LLAMA_CPP_WHEELS"\n')
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KVBRIDGE_", "LLAMA_CPP_", "MAKE"))}
    proc = subprocess.run(
        ["make", "-s", "-f", str(REPO / "Makefile"), "-f", str(extra), *args],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_wheel_cache_follows_kvbridge_home_and_is_exported_to_what_make_runs(tmp_path):
    out = _make(["showenv"], {"KVBRIDGE_HOME": str(tmp_path / "home")}, tmp_path)
    assert out.strip() == f"LLAMA_CPP_WHEELS={tmp_path / 'home'}/wheels"


def test_a_nested_run_with_an_empty_home_reuses_the_outer_wheels(tmp_path):
    outer = tmp_path / "outer-wheels"
    env = {"KVBRIDGE_HOME": str(tmp_path / "empty-home"), "LLAMA_CPP_WHEELS": str(outer)}
    assert _make(["showenv"], env, tmp_path).strip() == f"LLAMA_CPP_WHEELS={outer}"
    recipe = _make(["-n", "-B", ".venv/.kvbridge-installed"], env, tmp_path)
    assert f"ls {outer}/llama_cpp_python-0.3.36-*.whl" in recipe  # built only when the wheel is not there
    assert f"-w {outer}" in recipe and f"--find-links {outer}" in recipe
    assert "empty-home" not in recipe
