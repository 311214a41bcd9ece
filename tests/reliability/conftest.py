"""The reliability campaign's fixtures: tiny model folders, a corpus, a mapping and a pack,
and `expect_error`, the one assertion every bad-input case makes.

Every case asserts: exit status 2 (3 for an injected internal fault), exactly one stderr line
``error: <what> (fix: <how>)`` naming the thing, no traceback anywhere, and that nothing on
disk was damaged (protected paths byte-identical) or left half-written (no temp, old, lock or
resume-state siblings).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

#: names that mean a write was left half-done
LEFTOVER_MARKS = (".tmp-", ".old-", ".lock", ".fitstate", ".partial.jsonl")


def snapshot(root: Path) -> dict:
    """``{relative path: sha256 | 'dir' | 'link -> target'}`` of everything under ``root``."""
    out = {}
    if not root.exists() and not root.is_symlink():
        return out
    for p in sorted([root, *root.rglob("*")]):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"link -> {p.readlink()}"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def leftovers(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if any(m in p.name for m in LEFTOVER_MARKS))


def run_cli(args, *, input=None):
    from click.testing import CliRunner

    from kvbridge import faults
    from kvbridge.cli.main import build_cli

    faults.reset()
    res = CliRunner().invoke(
        build_cli(), [str(a) for a in args], input=input, catch_exceptions=True, prog_name="kvbridge"
    )
    return res


def expect_error(res, *needles: str, code: int = 2) -> str:
    """The one-line error contract; returns the line."""
    err = res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output and "Traceback" not in err
    assert res.exit_code == code, (res.exit_code, err, res.stdout[-500:])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, err
    line = errors[0]
    assert all(not ln.startswith(("Usage:", "Try ")) for ln in lines), err
    assert "(fix: " in line and line.endswith(")"), line
    for needle in needles:
        assert needle.lower() in line.lower(), (needle, line)
    return line


class World:
    """A scratch folder with two tiny Llamas sharing a tokenizer, a corpus, a mapping and a pack."""

    def __init__(self, root: Path, tiny_llama):
        self.root = root
        self.src = tiny_llama.model_dir(root / "src", seed=0)
        self.tgt = tiny_llama.model_dir(root / "tgt", seed=1)
        self.corpus = root / "corpus.txt"
        self.corpus.write_text(tiny_llama.corpus, encoding="utf-8")
        self.guide, self.prompt = tiny_llama.guide, tiny_llama.prompt
        self.mapping = root / "mapping"
        res = run_cli(
            [
                "fit",
                self.src,
                self.tgt,
                "--corpus",
                self.corpus,
                "--out",
                self.mapping,
                "--seq-len",
                32,
                "--tokens",
                512,
                "--top-k",
                1,
                "--stride",
                2,
                "--quiet",
            ]
        )
        assert res.exit_code == 0, res.output
        self.pack = root / "pack"
        res = run_cli(["pack", "save", self.src, "--guide", self.guide, "--out", self.pack])
        assert res.exit_code == 0, res.output

    def copy(self, name: str, dest: Path) -> Path:
        shutil.copytree(self.root / name, dest, symlinks=True)
        return dest

    def fit_args(self, out, *extra):
        return [
            "fit",
            self.src,
            self.tgt,
            "--corpus",
            self.corpus,
            "--out",
            out,
            "--seq-len",
            32,
            "--tokens",
            256,
            "--top-k",
            1,
            "--quiet",
            *extra,
        ]

    def model_copy(self, dest: Path, which: str = "src") -> Path:
        shutil.copytree(self.src if which == "src" else self.tgt, dest)
        return dest

    def edit_config(self, folder: Path, **changes) -> Path:
        cfg = json.loads((folder / "config.json").read_text())
        for k, v in changes.items():
            if v is _DELETE:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        (folder / "config.json").write_text(json.dumps(cfg))
        return folder


_DELETE = object()


@pytest.fixture(scope="session")
def world(tmp_path_factory, tiny_llama) -> World:
    return World(tmp_path_factory.mktemp("reliability-world"), tiny_llama)


@pytest.fixture
def scratch(tmp_path, world):
    """A per-test folder holding copies of the mapping and the pack (free to damage)."""
    world.copy("mapping", tmp_path / "mapping")
    world.copy("pack", tmp_path / "pack")
    return tmp_path


@pytest.fixture
def DELETE():
    return _DELETE


class Campaign:
    """The helpers as one fixture: ``c.cli(args)``, ``c.error(res, ...)``, ``c.snap(path)``, ``c.leftovers(dir)``."""

    cli = staticmethod(run_cli)
    error = staticmethod(expect_error)
    snap = staticmethod(snapshot)
    leftovers = staticmethod(leftovers)


@pytest.fixture
def c() -> Campaign:
    return Campaign()
