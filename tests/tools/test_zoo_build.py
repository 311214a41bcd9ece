"""The zoo's build tooling (tools/zoo): the shipped manifest matches today's recipes, the recorded
held-out losses reproduce from the corpus, and a build is deterministic."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvbridge.zoo import SPLITS, ZOO_NAMES, read_manifest
from tools.zoo.build import MAX_WEIGHTS_BYTES, model_recipe_hashes
from tools.zoo.recipes import CORPUS_SHA256, TINY, ZOO, recipe_hash

ROOT = Path(__file__).resolve().parents[2] / "src" / "kvbridge" / "zoo" / "models"


@pytest.fixture(scope="module")
def manifest() -> dict:
    return read_manifest(ROOT)


def test_the_package_names_and_splits_are_the_recipes():
    assert ZOO_NAMES == ZOO.names
    assert dict((k, (a, b)) for k, a, b in ZOO.splits) == SPLITS
    assert MAX_WEIGHTS_BYTES == 16 * 1024 * 1024


def test_manifest_matches_the_recipes(manifest):
    assert manifest["zoo_recipe_hash"] == recipe_hash(ZOO), "recipes changed: rebuild with `python -m tools.zoo.build`"
    hashes = model_recipe_hashes(ZOO)
    assert manifest["corpus"]["sha256"] == CORPUS_SHA256
    for name, rec in manifest["models"].items():
        assert rec["recipe_hash"] == hashes[name]
        assert rec["seed"] == ZOO.model(name).train.seed


def test_recorded_heldout_loss_reproduces_from_corpus(shared_dir, manifest):
    import torch

    from tools.zoo import train as T
    from tools.zoo.build import read_corpus
    from kvbridge.zoo.load import load_zoo_model

    text, sha = read_corpus(shared_dir / "corpora" / "tinyshakespeare.txt")
    assert sha == manifest["corpus"]["sha256"]
    a, b = manifest["splits"]["heldout"]["chars"]
    assert (a, b) == T.split_bounds(text, "heldout")
    for name in ZOO_NAMES:
        model, tok = load_zoo_model(name, root=ROOT)
        held = T.encode(tok, text[a:b])
        assert held.numel() == manifest["splits"]["heldout"]["tokens"]
        check = manifest["models"][name]["heldout_check"]
        with torch.no_grad():
            loss, n = T.heldout_loss(model, held, manifest["heldout"]["seq_len"], check["tokens"])
        assert n == check["tokens"]
        assert loss == pytest.approx(check["loss"], abs=2e-3), name


def _synthetic_text(n_lines: int = 600) -> str:
    rng = random.Random(0)
    words = "the king queen lord my thou art good night sweet prince love death sword crown".split()
    lines = []
    for _ in range(n_lines):
        lines += [
            rng.choice(["KING:", "QUEEN:", "LORD:"]),
            " ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) + ".",
            "",
        ]
    return "\n".join(lines)


def test_recipe_is_deterministic(tmp_path):
    from tools.zoo.build import build_zoo

    text = _synthetic_text()
    runs = [build_zoo(out=tmp_path / f"run{i}", recipe=TINY, corpus_text=text, log=lambda _: None) for i in range(2)]
    files = [{k: v["sha256"] for m in r["models"].values() for k, v in m["files"].items()} for r in runs]
    assert files[0] == files[1]
    assert runs[0]["models"]["tiny"]["heldout_loss"] == runs[1]["models"]["tiny"]["heldout_loss"]
    first = runs[0]["models"]
    assert (
        first["tiny"]["files"]["tiny/model.safetensors"] != first["tiny_tuned"]["files"]["tiny_tuned/model.safetensors"]
    )
    assert (tmp_path / "run0" / "manifest.json").is_file()


def test_the_deprecated_cli_spelling_runs_the_tool_in_a_checkout(monkeypatch, tmp_path, manifest):
    from click.testing import CliRunner

    import tools.zoo.build as build
    from kvbridge.cli.main import cli

    seen = {}

    def fake_build(corpus=None, out=None):  # the 20-minute build itself is test_recipe_is_deterministic's
        seen.update(corpus=corpus, out=out)
        return manifest

    monkeypatch.setattr(build, "build_zoo", fake_build)
    corpus = tmp_path / "tinyshakespeare.txt"
    corpus.write_text("ROMEO:\n")
    res = CliRunner().invoke(cli, ["zoo", "build", "--corpus", str(corpus), "--out", str(tmp_path / "zoo")])
    assert res.exit_code == 0, res.output
    assert "`kvbridge zoo build` is deprecated; use `python -m tools.zoo.build`" in res.stderr
    assert seen == {"corpus": corpus, "out": tmp_path / "zoo"} and "held-out" in res.stdout


def test_the_deprecated_cli_spelling_outside_a_checkout_names_the_tool(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from kvbridge.cli import zoo_cmd
    from kvbridge.cli.main import cli

    monkeypatch.setattr(zoo_cmd, "__file__", str(tmp_path / "site-packages" / "kvbridge" / "cli" / "zoo_cmd.py"))
    res = CliRunner().invoke(cli, ["zoo", "build"])
    assert res.exit_code == 2
    assert "needs a kvbridge checkout" in res.output and "python -m tools.zoo.build" in res.output


def test_the_tool_refuses_a_missing_corpus_in_one_line(capsys):
    from tools.zoo.build import main

    assert main(["--corpus", "/nonexistent/tinyshakespeare.txt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "corpus not found at /nonexistent/tinyshakespeare.txt" in err[0]
