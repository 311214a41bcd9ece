"""Campaign, class "from the real-model run": the mapping records the corpus as `sha256sum`
sees it and the span calibration read; eval refuses samples inside that span (or warns with
--allow-overlap); fit states observations per feature and warns below the threshold; long
runs show progress and keep partial results."""

from __future__ import annotations

import hashlib
import json

import pytest


def test_mapping_records_the_corpus_file_and_span(world):
    m = json.loads((world.mapping / "manifest.json").read_text())
    cal = m["calibration"]
    assert cal["corpus_sha256"] == hashlib.sha256(world.corpus.read_bytes()).hexdigest()  # what sha256sum prints
    assert cal["corpus"]["files"][0]["bytes"] == world.corpus.stat().st_size
    span = cal["span"]
    assert span["tokens"] == cal["tokens"] == 512
    start, end = span["bytes"]
    assert start == 0 and 0 < end < world.corpus.stat().st_size
    # the span really holds the calibration tokens: re-tokenising it gives (about) that many
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(world.src)
    text = world.corpus.read_bytes()[:end].decode()
    n = len(tok(text, add_special_tokens=False)["input_ids"])
    assert abs(n + 1 - span["tokens"]) <= 2  # + the EOS after the document
    assert cal["observations_per_feature"] == round(cal["observations_train"] / cal["features_per_head"], 3)


def _eval(world, mapping, *extra, heldout="0.1"):
    return [
        "eval",
        world.src,
        world.tgt,
        "--mapping",
        mapping,
        "--corpus",
        world.corpus,
        "--samples",
        2,
        "--prefix-len",
        8,
        "--continuation-len",
        2,
        "--greedy-tokens",
        2,
        "--bootstrap",
        0,
        "--no-attention",
        "--heldout-fraction",
        heldout,
        *extra,
    ]


def test_eval_refuses_samples_inside_the_calibration_span(world, tmp_path, c):
    big = tmp_path / "big"  # calibrated on the whole corpus (no held-out tail): its tail is calibration text
    res = c.cli(
        [
            "fit",
            world.src,
            world.tgt,
            "--corpus",
            world.corpus,
            "--corpus-heldout",
            0,
            "--out",
            big,
            "--seq-len",
            32,
            "--top-k",
            1,
            "--quiet",
            "--stride",
            8,
        ]
    )
    assert res.exit_code == 0, res.output
    line = c.error(c.cli(_eval(world, big)), "overlap")
    assert "--allow-overlap" in line
    res = c.cli(_eval(world, big, "--allow-overlap", "--json"))
    assert res.exit_code in (0, 1), res.output
    assert "warning: eval samples overlap" in res.stderr
    assert any("overlap" in n for n in json.loads(res.stdout)["notes"])


def test_eval_outside_the_span_is_accepted(world, c):
    res = c.cli(_eval(world, world.mapping, "--json"))  # 512 tokens of ~1700: the tail is unseen
    assert res.exit_code in (0, 1), res.stderr
    assert "overlap" not in res.stderr


def test_eval_on_another_corpus_is_not_checked(world, tmp_path, c):
    other = tmp_path / "other.txt"
    other.write_text(world.corpus.read_text()[::-1].replace("\n", " ") + "\n" + world.corpus.read_text())
    args = _eval(world, world.mapping)
    args[args.index("--corpus") + 1] = other
    res = c.cli(args)
    assert "overlap" not in res.stderr and res.exit_code in (0, 1), res.stderr


def test_fit_warns_below_the_observations_per_feature_threshold(world, tmp_path, c):
    from kvbridge.fit.calibrate import MIN_OBS_PER_FEATURE

    res = c.cli(
        [
            "fit",
            world.src,
            world.tgt,
            "--corpus",
            world.corpus,
            "--out",
            tmp_path / "m",
            "--seq-len",
            32,
            "--tokens",
            512,
            "--top-k",
            2,
            "--stride",
            4,
            "--quiet",
        ]
    )
    assert res.exit_code == 0, res.output
    assert "observations per feature" in res.stdout
    assert f"at least {MIN_OBS_PER_FEATURE} recommended" in res.stderr
    cal = json.loads((tmp_path / "m" / "manifest.json").read_text())["calibration"]
    assert cal["observations_per_feature"] < MIN_OBS_PER_FEATURE


def test_enough_observations_do_not_warn(world):
    m = json.loads((world.mapping / "manifest.json").read_text())
    assert m["calibration"]["observations_per_feature"] >= 10
    assert not any("per feature" in w for w in m["warnings"])


# -- long runs: progress and partial results -----------------------------------------------------------------
def test_eval_progress_lines_without_a_terminal(world, c, monkeypatch):
    monkeypatch.setenv("KVBRIDGE_PROGRESS_EVERY", "0")
    res = c.cli(_eval(world, "identity", "--batch-size", "1", "--json"))
    assert res.exit_code in (0, 1), res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("eval: ")]
    assert len(lines) == 2 and "2/2 samples (100%)" in lines[-1] and "tok/s" in lines[-1]
    assert "ETA" in lines[0]


def test_progress_redraws_on_a_terminal():
    import io

    from kvbridge.progress import Progress

    buf = io.StringIO()
    p = Progress(4, label="eval", stream=buf, tty=True)
    for i in range(1, 5):
        p.update(i, tokens=10)
    text = buf.getvalue()
    assert text.count("\r") == 4 and text.endswith("\n") and "4/4 samples" in text and "ETA" in text


@pytest.mark.parametrize("at", [1, 2])
def test_killed_eval_keeps_finished_batches(world, tmp_path, c, monkeypatch, at):
    from kvbridge.progress import read_partial

    monkeypatch.setenv("KVBRIDGE_FAULT", f"eval.batch:{at}")
    part = tmp_path / "part.jsonl"
    args = _eval(world, "identity", "--batch-size", "1", "--samples", "3", "--partial", part)
    c.error(c.cli(args), "injected", code=3)
    recs = read_partial(part)
    assert recs[0]["record"] == "header" and recs[0]["complete"] is False
    units = [r for r in recs if r["record"] == "unit"]
    assert [u["samples"] for u in units] == [[i, i + 1] for i in range(at)]
    assert "nll" in units[0]["conditions"]["transferred"]


def test_eval_report_partial_is_removed_once_the_report_lands(world, tmp_path, c):
    rep = tmp_path / "rep"
    res = c.cli(_eval(world, "identity", "--report", rep))
    assert res.exit_code in (0, 1), res.stderr
    assert (rep / "eval.json").is_file() and not c.leftovers(tmp_path)


def test_killed_diverge_keeps_finished_seeds(world, tmp_path, c, monkeypatch):
    from kvbridge.progress import read_partial

    monkeypatch.setenv("KVBRIDGE_FAULT", "diverge.seed:2")
    part = tmp_path / "div.jsonl"
    args = [
        "diverge",
        world.src,
        "--guide",
        world.guide,
        "--prompt",
        world.prompt,
        "--seeds",
        4,
        "--max-new-tokens",
        3,
        "--partial",
        part,
    ]
    c.error(c.cli(args), "injected", code=3)
    seeds = [r["seed"] for r in read_partial(part) if r["record"] == "unit"]
    assert seeds == [0, 1]


def test_diverge_completes_its_partial_log(world, tmp_path, c, monkeypatch):
    from kvbridge.progress import read_partial

    monkeypatch.setenv("KVBRIDGE_PROGRESS_EVERY", "0")
    part = tmp_path / "div.jsonl"
    res = c.cli(
        [
            "diverge",
            world.src,
            "--guide",
            world.guide,
            "--prompt",
            world.prompt,
            "--seeds",
            2,
            "--max-new-tokens",
            3,
            "--partial",
            part,
        ]
    )
    assert res.exit_code == 0, res.stderr
    recs = read_partial(part)
    assert recs[0]["complete"] is True and [r["seed"] for r in recs if r["record"] == "unit"] == [0, 1, "greedy"]
    assert "diverge: 3/3" in res.stderr
