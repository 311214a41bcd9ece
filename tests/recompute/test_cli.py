"""``kvbridge eval --recompute-*`` and ``kvbridge graft`` end to end on the zoo, and their bad-input errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner


@pytest.fixture(scope="module")
def corpus(zoo_base, tmp_path_factory):
    from kvbridge.evaluate import model_samples
    from kvbridge.models.loading import load_tokenizer_of
    from kvbridge.models.resolve import resolve

    tok = load_tokenizer_of(resolve("zoo:base"))
    ids = model_samples(zoo_base, n=8, length=100, seed=5)
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("\n".join(tok.decode(row[1:]) for row in ids), encoding="utf-8")
    return path


def _cli(*args):
    from kvbridge.cli.main import cli

    return CliRunner().invoke(cli, list(args))


def test_eval_recompute_curve(corpus, tmp_path):
    res = _cli(
        "eval",
        "zoo:base",
        "zoo:stranger",
        "--mapping",
        "identity",
        "--corpus",
        str(corpus),
        "--samples",
        "4",
        "--prefix-len",
        "16",
        "--continuation-len",
        "4",
        "--bootstrap",
        "40",
        "--heldout-fraction",
        "0.5",
        "--recompute-layers",
        "auto:25%;all;1,2-3",
        "--recompute-tokens",
        "100%",
        "--calibration-samples",
        "2",
        "--json",
        "--report",
        str(tmp_path / "r"),
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    c = data["conditions"]
    assert {"native", "transferred", "layers@1", "layers@4", "layers@3", "tokens@1", "no_prefix"} <= set(c)
    assert c["layers@3"]["layers"] == [1, 2, 3]
    assert c["layers@4"]["kl_p95"] < 1e-9 and c["tokens@1"]["kl_p95"] < 1e-9
    assert c["transferred"]["kl_p95"] > 1e-3
    assert c["layers@1"]["share"] == 0.25 and len(c["layers@1"]["layers"]) == 1
    assert data["selection"]["method"] == "greedy"
    assert (tmp_path / "r" / "recompute_curve.md").exists() and (tmp_path / "r" / "recompute_curve.json").exists()


def test_eval_recompute_token_rules_give_one_point_per_rule(corpus):
    res = _cli(
        "eval",
        "zoo:base",
        "zoo:stranger",
        "--mapping",
        "identity",
        "--corpus",
        str(corpus),
        "--samples",
        "4",
        "--prefix-len",
        "16",
        "--continuation-len",
        "4",
        "--bootstrap",
        "20",
        "--heldout-fraction",
        "0.5",
        "--recompute-tokens",
        "50%,100%",
        "--recompute-token-rules",
        "deviation,last",
        "--json",
    )
    assert res.exit_code == 0, res.output
    c = json.loads(res.stdout)["conditions"]
    assert {"tokens@0.5", "tokens@1", "last@0.5", "last@1"} <= set(c), sorted(c)
    assert c["last@1"]["kl_p95"] < 1e-9  # every token recomputed: the target's own cache, whichever rule
    bad = _cli(
        "eval",
        "zoo:base",
        "zoo:stranger",
        "--mapping",
        "identity",
        "--corpus",
        str(corpus),
        "--recompute-tokens",
        "50%",
        "--recompute-token-rules",
        "tail",
    )
    assert bad.exit_code == 2 and "unknown rule 'tail'" in bad.output


@pytest.mark.parametrize(
    "args,needle",
    [
        (("--recompute-layers", "9"), "layer 9 does not exist"),
        (("--recompute-tokens", "150%"), "outside 0..100%"),
    ],
)
def test_eval_recompute_bad_input(corpus, args, needle):
    res = _cli(
        "eval",
        "zoo:base",
        "zoo:stranger",
        "--mapping",
        "identity",
        "--corpus",
        str(corpus),
        "--samples",
        "2",
        "--prefix-len",
        "16",
        "--continuation-len",
        "4",
        "--bootstrap",
        "0",
        "--heldout-fraction",
        "0.5",
        *args,
    )
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output


def test_graft_run_and_eval(corpus, tmp_path):
    res = _cli(
        "graft",
        "run",
        "zoo:base",
        "--context",
        "First Citizen: Before we proceed",
        "--chunk",
        " any further, hear me speak.",
        "--prompt",
        " All: Speak,",
        "--recompute-tokens",
        "100%",
        "--max-new-tokens",
        "4",
        "--json",
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["first_token_kl"]["grafted"] < 1e-9 and out["greedy_agreement_steps"]["grafted"] == 4
    res = _cli(
        "graft",
        "eval",
        "zoo:base",
        "--corpus",
        str(corpus),
        "--samples",
        "2",
        "--context-len",
        "8",
        "--chunk-len",
        "12",
        "--continuation-len",
        "4",
        "--ratios",
        "50%",
        "--controls",
        "random",
        "--bootstrap",
        "20",
        "--report",
        str(tmp_path / "g"),
    )
    assert res.exit_code == 0, res.output
    assert "blend@0.5" in res.output and (tmp_path / "g" / "graft.json").exists()
    res = _cli("graft", "run", "zoo:base", "--context", "a", "--prompt", "b")
    assert res.exit_code == 2 and "exactly one of --chunk and --pack" in res.output


def _frontier(corpus, *args):
    return _cli(
        "eval",
        "zoo:base",
        "zoo:stranger",
        "--mapping",
        "identity",
        "--corpus",
        str(corpus),
        "--samples",
        "4",
        "--prefix-len",
        "16",
        "--continuation-len",
        "4",
        "--heldout-fraction",
        "0.5",
        *args,
    )


def test_eval_frontier(corpus, tmp_path):
    res = _frontier(
        corpus, "--frontier", "0.5,1", "--bootstrap", "20", "--no-attention", "--json", "--report", str(tmp_path / "r")
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    c = data["conditions"]
    assert {
        "native",
        "source",
        "transferred",
        "truncated@0.5",
        "tail@0.5",
        "truncated@1",
        "tail@1",
        "no_prefix",
    } == set(c)
    assert c["tail@1"]["kl_p95"] < 1e-6 and c["truncated@1"]["kl_p95"] < 1e-6
    assert data["sink"] == 4 and data["verdict"]["text"] and data["mapping"] == "identity"
    assert (tmp_path / "r" / "frontier.json").exists() and "verdict:" in (tmp_path / "r" / "frontier.md").read_text()
    text = _frontier(corpus, "--frontier", "25%", "--sink", "2", "--bootstrap", "0", "--no-attention")
    assert text.exit_code == 0, text.output
    assert "truncated@0.25" in text.stdout and "verdict: no verdict" in text.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (("--frontier", "0.1,x"), "'x' is not a number"),
        (("--frontier", "2"), "'2' is outside 0..1"),
        (("--frontier", "0.5,50%"), "'50%' is repeated"),
        (("--frontier", ""), "names no share"),
        (("--frontier", "0.5", "--sink", "-1"), "--sink"),
        (("--frontier", "0.5", "--recompute-tokens", "0.5"), "--recompute-* cannot be combined"),
        (("--frontier", "0.5", "--conditions", "native,source"), "--conditions cannot be combined"),
    ],
)
def test_eval_frontier_bad_input(corpus, args, needle):
    res = _frontier(corpus, "--bootstrap", "0", *args)
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output
    assert len([line for line in res.output.splitlines() if line.strip()]) <= 3, res.output
