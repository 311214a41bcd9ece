"""A user installs the wheel, not the repo: build it, install it into a fresh venv, run the CLI.

The venv gets the wheel with ``--no-deps`` (no downloads); its dependencies come from the
test interpreter's site-packages through a ``.pth`` line (kvbridge itself is not there as a
plain package, so the wheel's copy is the one imported). The commands run from a folder
outside the repository with no PYTHONPATH, so only package data can supply the manifests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_manifests_and_runs_check(tmp_path):
    import shutil

    src = tmp_path / "src-copy"  # build from a copy: no build/ or egg-info left in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    assert "License classifiers are deprecated" not in build.stderr and "license" not in build.stderr.lower()
    (wheel,) = wheels.glob("kvbridge-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "kvbridge/manifests/models/Qwen__Qwen2.5-0.5B.json" in names
    assert "kvbridge/manifests/schemas/mapping.schema.json" in names
    assert "kvbridge/manifests/results/qwen2.5-coder-0.5b__qwen2.5-coder-1.5b.json" in names  # measured verdicts

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "_kvbridge_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    inst = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert inst.returncode == 0, inst.stderr[-2000:]

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVBRIDGE_MANIFEST_PATH")}
    env["HF_HUB_CACHE"] = str(tmp_path / "no-hf-cache")
    where = subprocess.run(
        [str(py), "-c", "import kvbridge; print(kvbridge.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert where.returncode == 0 and str(site) in where.stdout, (where.stdout, where.stderr)
    res = subprocess.run(
        [str(py), "-m", "kvbridge", "check", "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "Qwen2.5-0.5B" in res.stdout and "Traceback" not in res.stderr
    listed = subprocess.run(
        [str(py), "-m", "kvbridge", "describe", "--list"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert listed.returncode == 0 and "meta-llama/Llama-3.2-1B" in listed.stdout, listed.stderr
