"""`kvbridge steer build|run|eval|transfer`: outputs, and bad input as one-line errors with exit 2 and
nothing written."""

from __future__ import annotations

import json

import pytest

from kvbridge.testing.cli import one_line_error, run_cli as run

PAIRS = [
    {"positive": "ROMEO: my sweet love, fair and gentle", "negative": "ROMEO: blood and death, kill and curse"},
    {"positive": "JULIET: O joy, my dear and noble love", "negative": "JULIET: O woe, foul villain and murder"},
]


def nothing_written(folder, name):
    assert not (folder / name).exists()
    assert not [p for p in folder.iterdir() if p.name.startswith(f".{name}")], list(folder.iterdir())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("steer")
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    res = run("steer", "build", "zoo:base", "--pairs", pairs, "--out", root / "vec", "--json")
    assert res.exit_code == 0, res.output
    return {"root": root, "pairs": pairs, "vec": root / "vec", "manifest": json.loads(res.stdout)}


def test_build_writes_a_versioned_vector(built):
    m = built["manifest"]
    assert m["kind"] == "kvbridge.steering-vector" and m["num_pairs"] == 2 and m["method"] == "mean"
    assert m["model"]["model_type"] == "llama" and m["tokenizer"]["fingerprint"]
    assert sorted(p.name for p in built["vec"].iterdir()) == [
        ".kvbridge-artifact.json",
        "manifest.json",
        "vector.safetensors",
    ]


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"positive": "a"\n', "not JSON"),
        ("\n\n", "has no pairs"),
        ('{"positive": "", "negative": "x"}\n', "empty text"),
        ('{"pos": "a", "neg": "b"}\n', "'positive' and 'negative'"),
    ],
)
def test_build_refuses_bad_pairs_files_and_writes_nothing(built, tmp_path, content, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    one_line_error(run("steer", "build", "zoo:base", "--pairs", bad, "--out", tmp_path / "out"), needle)
    nothing_written(tmp_path, "out")


def test_build_refuses_an_existing_output(built):
    one_line_error(
        run("steer", "build", "zoo:base", "--pairs", built["pairs"], "--out", built["vec"]), "already exists"
    )


def test_run_side_by_side_and_zero_coefficient_is_identical(built):
    res = run(
        "steer",
        "run",
        "zoo:base",
        "--vector",
        built["vec"],
        "--prompt",
        "ROMEO: I will",
        "--cv",
        "0",
        "--max-new-tokens",
        "8",
    )
    assert res.exit_code == 0, res.output
    assert "unsteered" in res.stdout and "| steered" in res.stdout and "identical continuations" in res.stdout
    res = run(
        "steer",
        "run",
        "zoo:base",
        "--vector",
        built["vec"],
        "--prompt",
        "ROMEO: I will",
        "--cv",
        "12",
        "--max-new-tokens",
        "8",
        "--json",
    )
    d = json.loads(res.stdout)
    assert res.exit_code == 0 and d["approximate"] is True and d["first_step_kl"] > 0
    assert d["steering"]["method"] == "kv-vector" and d["steering"]["cv"] == 12.0


def test_run_other_methods(built):
    for args in (
        ["--method", "kv-scale", "--cv", "0.5", "--layers", "1-2"],
        ["--method", "kv-mix", "--other", "KING: war and blood", "--alpha", "1", "--layers", "3"],
        ["--method", "kv-bank", "--at", "guide", "--guide", "JULIET: O sweet love.", "--layers", "0-1"],
        ["--method", "actadd", "--vector", built["vec"], "--ca", "2"],
    ):
        res = run("steer", "run", "zoo:base", "--prompt", "ROMEO: I will", "--max-new-tokens", "4", "--json", *args)
        assert res.exit_code == 0, (args, res.output)
        assert json.loads(res.stdout)["steering"]["method"] == args[1]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--cv", "nan"], "'--cv': 'nan' is not a finite number"),
        (["--ck", "inf"], "'--ck': 'inf' is not a finite number"),
        (["--layers", "9"], "out of range"),
        (["--layers", "2-x"], "cannot read layer spec"),
        (["--alpha", "1"], "does not apply to steering method 'kv-vector'"),
        (["--at", "guide"], "--at guide needs --guide"),
    ],
)
def test_run_bad_arguments_are_one_line_errors(built, args, needle):
    one_line_error(
        run("steer", "run", "zoo:base", "--vector", built["vec"], "--prompt", "ROMEO: I will", *args), needle
    )


def test_a_vector_for_another_model_is_refused(built):
    one_line_error(
        run("steer", "run", "zoo:tuned", "--vector", built["vec"], "--prompt", "ROMEO: I will"),
        "made for another model",
        "weights",
    )
    one_line_error(
        run(
            "steer",
            "eval",
            "zoo:odd",
            "--vector",
            built["vec"],
            "--prompt",
            "ROMEO: I will",
            "--scorer",
            "positive_sentiment",
        ),
        "geometry",
    )


def test_eval_writes_a_report_and_refuses_bad_input(built, tmp_path):
    out = tmp_path / "report"
    res = run(
        "steer",
        "eval",
        "zoo:base",
        "--vector",
        built["vec"],
        "--prompt",
        "ROMEO: I will",
        "--scorer",
        "positive_sentiment",
        "--arms",
        "none,kv,random",
        "--samples",
        "2",
        "--max-new-tokens",
        "4",
        "--sweep",
        "0.5,2",
        "--out",
        out,
    )
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == [".kvbridge-artifact.json", "report.json", "report.md", "sweep.png"]
    rep = json.loads((out / "report.json").read_text())
    assert set(rep["arms"]) == {"none", "kv", "random"} and len(rep["sweep"]["kv"]) == 2
    base = [
        "steer",
        "eval",
        "zoo:base",
        "--vector",
        built["vec"],
        "--prompt",
        "ROMEO: I will",
        "--samples",
        "2",
        "--max-new-tokens",
        "2",
    ]
    one_line_error(run(*base, "--scorer", "sentimnt"), "unknown scorer")
    one_line_error(
        run(*base, "--scorer", "bullets", "--cv", "nan", "--out", tmp_path / "r2"),
        "'--cv': 'nan' is not a finite number",
    )
    nothing_written(tmp_path, "r2")
    one_line_error(run(*base, "--scorer", "bullets", "--sweep", "1,nan"), "--sweep")
    one_line_error(run(*base, "--scorer", "bullets", "--layers", "4", "--out", tmp_path / "r3"), "out of range")
    nothing_written(tmp_path, "r3")


def test_transfer_through_a_fitted_mapping(built, tmp_path):
    import torch

    from kvbridge.fit import fit
    from kvbridge.steer.artifact import read_vector
    from kvbridge.models import load

    loaded = load("zoo:base")
    source, tok = loaded.model, loaded.tokenizer
    target = load("zoo:tuned").model
    torch.manual_seed(0)
    start = tok("\n", return_tensors="pt").input_ids.repeat(6, 1)
    texts = tok.batch_decode(source.generate(start, do_sample=True, top_k=40, max_new_tokens=40))
    fit(source, target, texts, tokenizer=tok, seq_len=40, top_k=1, stride=2, out=tmp_path / "map")
    res = run(
        "steer",
        "transfer",
        built["vec"],
        "--mapping",
        tmp_path / "map",
        "--source",
        "zoo:base",
        "--target",
        "zoo:tuned",
        "--out",
        tmp_path / "moved",
    )
    assert res.exit_code == 0, res.output
    manifest, moved = read_vector(tmp_path / "moved")
    assert manifest["method"] == "transferred(mean)" and manifest["has_residual"] is False
    assert manifest["transferred_from"]["mapping"]
    res = run(
        "steer",
        "run",
        "zoo:tuned",
        "--vector",
        tmp_path / "moved",
        "--prompt",
        "ROMEO: I will",
        "--cv",
        "4",
        "--max-new-tokens",
        "4",
    )
    assert res.exit_code == 0, res.output
    one_line_error(
        run("steer", "run", "zoo:base", "--vector", tmp_path / "moved", "--prompt", "ROMEO: I will"),
        "made for another model",
    )
    one_line_error(
        run(
            "steer",
            "transfer",
            built["vec"],
            "--mapping",
            tmp_path / "map",
            "--source",
            "zoo:tuned",
            "--target",
            "zoo:base",
            "--out",
            tmp_path / "wrong",
        ),
        "made for another model",
    )
    nothing_written(tmp_path, "wrong")
