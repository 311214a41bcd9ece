"""Campaign, the commands a new user types first: their refusals are one line that says what to do.

- a ``--memory`` below what the fit can block into names the smallest workable budget, in a unit
  that shows it (never ``0.00 GiB``), and that value is accepted;
- ``fit`` then ``eval`` on one text file: a fit recorded with a smaller held-out tail than eval
  asks for is refused (the defaults agree: tests/fit/test_cli.py);
- ``pack export`` without ``--model``: a pack whose recorded model the engine cannot run, or that
  records none, is one line naming the model and asking for ``--model``.
"""

from __future__ import annotations

import json


def test_a_memory_budget_below_the_minimum_names_it(world, tmp_path, c):
    out = tmp_path / "m"
    line = c.error(c.cli(world.fit_args(out, "--memory", "0.0000001")), "--memory", "smallest workable budget")
    assert "0.00 GiB" not in line and " B budget" in line  # 107 bytes, said as such
    flag = line.split("pass --memory ")[1].split()[0]
    assert not out.exists() and not c.leftovers(tmp_path)
    res = c.cli(world.fit_args(out, "--memory", flag))  # the named minimum works
    assert res.exit_code == 0, res.output
    half = float(flag) / 2
    c.error(c.cli(world.fit_args(tmp_path / "m2", "--memory", repr(half))), f"pass --memory {flag} ")


def test_the_plan_names_the_same_minimum(world, c):
    line = c.error(c.cli(["fit", world.src, world.tgt, "--plan", "--top-k", 1, "--memory", "0.0000001"]), "--memory")
    fit = c.error(c.cli(["fit", world.src, world.tgt, "--plan", "--top-k", 1, "--memory", "0.0000002"]), "--memory")
    assert line.split("pass --memory ")[1].split()[0] == fit.split("pass --memory ")[1].split()[0]


def test_eval_refuses_a_tail_reaching_into_the_fit(world, tmp_path, c):
    out = tmp_path / "m"
    fit = ["fit", world.src, world.tgt, "--corpus", world.corpus, "--out", out, "--seq-len", 32, "--top-k", 1]
    res = c.cli([*fit, "--quiet"])  # no --tokens: the whole file but its held-out tail (10%, the default)
    assert res.exit_code == 0, res.output
    tail = json.loads((out / "manifest.json").read_text())["calibration"]["corpus"]["heldout_tail"]
    assert tail["heldout"] == 0.1
    args = ["eval", world.src, world.tgt, "--mapping", out, "--corpus", world.corpus, "--samples", 2]
    c.error(c.cli([*args, "--heldout-fraction", "0.5"]), "overlap", "--heldout-fraction")


def test_pack_export_without_model_names_the_packs_model(world, scratch, c):
    out = scratch / "s.llamacpp-seq"
    line = c.error(c.cli(["pack", "export", scratch / "pack", "--out", out]), "--model", "llamacpp cannot run")
    assert str(world.src) in line  # the folder the pack was saved from: no .gguf for llama.cpp
    assert not out.exists()
    m = json.loads((scratch / "pack" / "manifest.json").read_text())
    m["model"].pop("reference")  # a pack saved before packs recorded their model
    (scratch / "pack" / "manifest.json").write_text(json.dumps(m))
    c.error(c.cli(["pack", "export", scratch / "pack", "--out", out]), "records no model reference", "--model")
    m["model"]["reference"] = str(scratch / "gone")  # a model that is not here
    (scratch / "pack" / "manifest.json").write_text(json.dumps(m))
    c.error(c.cli(["pack", "export", scratch / "pack", "--out", out]), "does not resolve here", "--model")
    assert not out.exists()
