"""`kvbridge fit` and `kvbridge transfer` end to end on planted model folders."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from kvbridge.cli.main import build_cli

CHARS = [chr(c) for c in range(32, 127)] + ["\n"]


def char_tokenizer(shuffle: int | None = None):
    """A character-level tokenizer (ids < 128, our tiny vocab); ``shuffle`` permutes the ids."""
    import random

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = ["<unk>", "<eos>"] + CHARS
    if shuffle is not None:
        random.Random(shuffle).shuffle(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


@pytest.fixture(scope="module")
def folders(tmp_path_factory, planted):
    root = tmp_path_factory.mktemp("cli")
    tok = char_tokenizer()
    for role in ("source", "target"):
        planted[role].save_pretrained(root / role)
        tok.save_pretrained(root / role)
    shutil.copytree(root / "target", root / "other-tok")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (root / "other-tok" / name).unlink(missing_ok=True)
    char_tokenizer(shuffle=1).save_pretrained(root / "other-tok")
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex the jovial king".split()
    import random

    rng = random.Random(0)
    (root / "corpus").mkdir()
    for d in range(3):
        text = " ".join(rng.choice(words) for _ in range(200))
        (root / "corpus" / f"doc{d}.txt").write_text(text + "\n")
    return root


def run(*args):
    result = CliRunner().invoke(build_cli(), [str(a) for a in args], catch_exceptions=False)
    return result


def test_fit_then_transfer(folders):
    out = folders / "map"
    res = run(
        "fit",
        folders / "source",
        folders / "target",
        "--corpus",
        folders / "corpus",
        "--out",
        out,
        "--seq-len",
        48,
        "--tokens",
        1920,
        "--stride",
        2,
        "--top-k",
        2,
        "--batch-size",
        8,
    )
    assert res.exit_code == 0, res.output
    assert "held-out R²: mean 1.0000" in res.output and "tok/s" in res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["digest"] and len(manifest["calibration"]["corpus_sha256"]) == 64
    assert manifest["calibration"]["tokens"] == 1920
    assert [s[0] for s in manifest["layer_selection"]] == [0, 1, 1, 2, 3, 3]

    res = run(
        "transfer",
        folders / "source",
        folders / "target",
        "--mapping",
        out,
        "--prompt",
        "the lazy king jumps over",
        "--max-new-tokens",
        6,
        "--compare",
    )
    assert res.exit_code == 0, res.output
    assert "agreement 6/6 greedy tokens" in res.output
    assert "x counting the source prefill" in res.output and "x (target prefill / mapping)" in res.output

    again = run("fit", folders / "source", folders / "target", "--corpus", folders / "corpus", "--out", out)
    assert again.exit_code == 2 and "already exists" in again.output and "Traceback" not in again.output


def test_refusals_are_one_line(folders):
    res = run(
        "fit", folders / "source", folders / "other-tok", "--corpus", folders / "corpus", "--out", folders / "nope"
    )
    assert res.exit_code == 2 and "tokenizers" in res.output and len(res.output.strip().splitlines()) == 1
    assert not (folders / "nope").exists()
    res = run(
        "fit", folders / "source", folders / "target", "--corpus", folders / "missing.txt", "--out", folders / "nope"
    )
    assert res.exit_code == 2 and "no such corpus" in res.output
    res = run(
        "fit",
        folders / "source",
        folders / "target",
        "--corpus",
        folders / "corpus",
        "--out",
        folders / "nope",
        "--alpha",
        "lots",
    )
    assert res.exit_code == 2 and "--alpha" in res.output
    assert not (folders / "nope").exists()


def test_transfer_refuses_a_mapping_for_other_models_unless_forced(folders):
    out = folders / "map"
    if not out.exists():
        pytest.skip("needs test_fit_then_transfer")
    res = run("transfer", folders / "target", folders / "target", "--mapping", out, "--prompt", "the king")
    assert res.exit_code == 2 and "source." in res.output


def test_fitter_options_are_generic_and_checked(folders):
    base = [
        "fit",
        folders / "source",
        folders / "target",
        "--corpus",
        folders / "corpus",
        "--seq-len",
        48,
        "--tokens",
        1920,
        "--stride",
        2,
        "--batch-size",
        8,
    ]
    res = run(*base, "--out", folders / "nope", "-o", "topk=2")  # refused before any model loads
    assert res.exit_code == 2 and "has no option 'topk'" in res.output and "did you mean top_k" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (folders / "nope").exists()
    res = run(*base, "--out", folders / "nope", "-o", "top_k=two")
    assert res.exit_code == 2 and "top_k='two' is not a int" in res.output
    res = run(*base, "--out", folders / "nope", "--fitter", "ridge-headwise", "-o", "top_k=2")
    assert res.exit_code == 2 and "'ridge-headwise' has no option 'top_k'" in res.output
    out = folders / "map-o"
    res = run(*base, "--out", out, "-o", "top_k=2", "-o", "alpha=auto")
    assert res.exit_code == 0, res.output
    params = json.loads((out / "manifest.json").read_text())["fitter"]["params"]
    assert params["top_k"] == 2 and params["alpha"] == "auto"
    # --overwrite replaces; the old --force alias is gone (0.x: CHANGELOG.md) and is a usage error
    res = run(*base, "--out", out, "-o", "top_k=1", "--overwrite")
    assert res.exit_code == 0 and json.loads((out / "manifest.json").read_text())["fitter"]["params"]["top_k"] == 1
    res = run(*base, "--out", out, "--top-k", 2, "--force")
    assert res.exit_code == 2 and "No such option '--force'" in res.output
    assert "--force" not in run("fit", "--help").output and "--overwrite" in run("fit", "--help").output


def test_transfer_accepts_a_mismatch_only_when_asked(folders):
    out = folders / "map"
    if not out.exists():
        pytest.skip("needs test_fit_then_transfer")
    res = run("transfer", folders / "target", folders / "target", "--mapping", out, "--prompt", "the king")
    assert res.exit_code == 2 and "--accept-fingerprint-mismatch" in res.output


def test_the_two_meanings_of_force_have_two_names():
    for cmd in ("eval", "transfer"):
        text = run(cmd, "--help").output
        assert "--accept-fingerprint-mismatch" in text and "--force" not in text, cmd
    fit_help = run("fit", "--help").output
    assert "--overwrite" in fit_help and "--accept-fingerprint-mismatch" not in fit_help


@pytest.fixture(scope="module")
def code_folder(tmp_path_factory):
    """A folder of .py files (a package inside), the shape of a user's source tree."""
    import random

    root = tmp_path_factory.mktemp("code") / "src"
    (root / "pkg").mkdir(parents=True)
    rng = random.Random(1)
    names = "alpha beta gamma delta total count index value result items".split()
    for i in range(24):
        body = "".join(
            f"def {rng.choice(names)}_{j}(x):\n    return x + {j} * {rng.choice(names)}\n\n" for j in range(12)
        )
        ((root / "pkg") if i % 3 else root).joinpath(f"mod{i}.py").write_text(body, encoding="utf-8")
    return root


def test_a_folder_corpus_is_split_by_file_and_eval_reads_only_the_held_out_files(
    folders, code_folder, tmp_path, monkeypatch
):
    import hashlib
    import time

    import kvbridge.models.loading as loading
    from kvbridge.corpus import Split, read_corpus

    real_load = loading.load

    def slow_load(*args, **kwargs):  # a model that takes a while to load, as real ones do (5x the heartbeat)
        time.sleep(0.5)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(loading, "load", slow_load)  # what fit and eval load their pair through

    out = tmp_path / "map"
    res = CliRunner().invoke(
        build_cli(),
        [
            str(a)
            for a in (
                "fit",
                folders / "source",
                folders / "target",
                "--corpus",
                code_folder,
                "--out",
                out,
                "--seq-len",
                48,
                "--tokens",
                960,
                "--stride",
                4,
                "--top-k",
                2,
                "--corpus-heldout",
                0.25,
            )
        ],
        catch_exceptions=False,
        env={"KVBRIDGE_PROGRESS_EVERY": "0.1"},
    )
    assert res.exit_code == 0, res.output
    # logs (stderr is not a terminal here): a plain line at each stage, model loading included
    assert "fit: loading the models, 0:0" in res.stderr and " elapsed (0:0" in res.stderr
    corpus = json.loads((out / "manifest.json").read_text())["calibration"]["corpus"]
    split = corpus["split"]
    assert split["rule"] == "path-sha256" and split["heldout"] == 0.25 and split["heldout_files"] >= 1
    assert split["calibration_files"] + split["heldout_files"] == corpus["files_count"] == 24
    assert corpus["sha256"] == read_corpus(code_folder).sha256

    def ev(*extra):
        return CliRunner().invoke(
            build_cli(),
            [
                str(a)
                for a in (
                    "eval",
                    folders / "source",
                    folders / "target",
                    "--mapping",
                    out,
                    "--corpus",
                    code_folder,
                    "--samples",
                    2,
                    "--prefix-len",
                    16,
                    "--continuation-len",
                    4,
                    "--greedy-tokens",
                    2,
                    "--bootstrap",
                    20,
                    "--conditions",
                    "native,transferred,no_prefix",
                    "--no-attention",
                    "--json",
                    *extra,
                )
            ],
            env={"KVBRIDGE_PROGRESS_EVERY": "0.1"},
        )

    res = ev()
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)["data"]
    assert data["sha256"] == corpus["sha256"]  # one corpus, one hash
    assert data["split"]["from_mapping"] and data["split"]["heldout_files"] == split["heldout_files"]
    assert "eval: loading the models, 0:0" in res.stderr
    held = {f.rel for f in read_corpus(code_folder).part(Split(0.25), "heldout")}
    assert len(held) == split["heldout_files"]
    bad = ev("--heldout-fraction", "0.6")  # a bigger held-out share reaches into calibration files
    assert bad.exit_code == 2 and "calibration files of the mapping" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) - bad.stderr.count("eval: ") == 1 and "Traceback" not in bad.stderr
    assert ev("--heldout-fraction", "0.6", "--allow-overlap").exit_code == 0
    assert ev("--heldout-fraction", "0.2").exit_code == 0  # a smaller share only drops held-out files

    one = tmp_path / "one.txt"
    one.write_text((code_folder / "mod0.py").read_text() * 8, encoding="utf-8")
    res = CliRunner().invoke(
        build_cli(),
        [
            str(a)
            for a in (
                "eval",
                folders / "source",
                folders / "source",
                "--mapping",
                "identity",
                "--corpus",
                one,
                "--samples",
                2,
                "--prefix-len",
                16,
                "--continuation-len",
                4,
                "--greedy-tokens",
                2,
                "--bootstrap",
                20,
                "--conditions",
                "native,no_prefix",
                "--no-attention",
                "--json",
                "--heldout-fraction",
                "0.5",
            )
        ],
    )
    assert res.exit_code == 0, res.output  # a file corpus: eval's hash is sha256sum's, as fit records it
    assert json.loads(res.stdout)["data"]["sha256"] == hashlib.sha256(one.read_bytes()).hexdigest()


def test_fit_sweeps_top_k_keeps_statistics_and_refits_from_them(folders, tmp_path):
    base = [
        "fit",
        folders / "source",
        folders / "target",
        "--seq-len",
        48,
        "--tokens",
        1920,
        "--stride",
        2,
        "--batch-size",
        8,
        "--quiet",
    ]
    res = run(
        *base,
        "--corpus",
        folders / "corpus",
        "--out",
        tmp_path / "sweep",
        "--top-k",
        "1,2",
        "--keep-stats",
        tmp_path / "stats",
    )
    assert res.exit_code == 0, res.output
    assert "2 mappings from one pass" in res.output and "k1: top-k 1" in res.output and "k2: top-k 2" in res.output
    assert (tmp_path / "sweep" / "k2" / "manifest.json").is_file() and (tmp_path / "stats" / "manifest.json").is_file()
    res = run(
        "fit",
        folders / "source",
        folders / "target",
        "--from-stats",
        tmp_path / "stats",
        "--out",
        tmp_path / "again",
        "--top-k",
        1,
        "--alpha",
        "0.5",
    )
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "again" / "manifest.json").read_text())
    assert manifest["fitter"]["params"]["top_k"] == 1 and manifest["fitter"]["params"]["alpha"] == 0.5
    res = run(
        "fit", folders / "target", folders / "target", "--from-stats", tmp_path / "stats", "--out", tmp_path / "wrong"
    )
    assert res.exit_code == 2 and "different source model" in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "wrong").exists()
    res = run(*base, "--corpus", folders / "corpus", "--out", tmp_path / "bad", "--top-k", "1,zero")
    assert res.exit_code == 2 and "--top-k" in res.output and "'zero'" in res.output


def _verses(n_lines: int, seed: int = 0) -> str:
    import random

    rng = random.Random(seed)
    words = "the king and queen of all my heart shall speak to thee good lord what is this night".split()
    return "".join(
        " ".join(rng.choice(words) for _ in range(rng.randint(5, 10))).capitalize() + ".\n" for _ in range(n_lines)
    )


def test_fit_then_eval_on_one_text_file_with_default_flags(tmp_path):
    """The two commands a user runs first: `fit --corpus F` (no --tokens) reads the file but its last
    10%, which eval reads, and records that tail; `eval --corpus F` then samples from it, no flag needed."""
    from kvbridge.corpus import heldout_start

    text = tmp_path / "small.txt"
    text.write_text(_verses(400), encoding="utf-8")
    out = tmp_path / "m"
    run = lambda *args: CliRunner().invoke(build_cli(), [str(a) for a in args])  # noqa: E731
    res = run("fit", "zoo:base", "zoo:tuned", "--corpus", text, "--out", out, "--quiet")
    assert res.exit_code == 0, res.output
    cal = json.loads((out / "manifest.json").read_text())["calibration"]
    body = text.read_text(encoding="utf-8")
    start = heldout_start(body, 0.1)
    assert (
        cal["corpus"]["heldout_tail"]["chars"] == [start, len(body)] and cal["corpus"]["heldout_tail"]["heldout"] == 0.1
    )
    assert 0 < cal["span"]["chars"][1] <= start  # the fit read nothing of the tail
    assert "held out for eval (not read): the last 0.1 of the file" in res.output
    args = ("eval", "zoo:base", "zoo:tuned", "--mapping", out, "--corpus", text, "--samples", 4, "--prefix-len", 32)
    res = run(*args, "--continuation-len", 4, "--greedy-tokens", 2, "--bootstrap", 20, "--no-attention", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["data"]["heldout_fraction"] == 0.1
    whole = tmp_path / "whole"  # --corpus-heldout 0: the whole file, as before; eval on it then refuses
    res = run("fit", "zoo:base", "zoo:tuned", "--corpus", text, "--out", whole, "--corpus-heldout", 0, "--seq-len", 64)
    assert res.exit_code == 0, res.output
    res = run("eval", "zoo:base", "zoo:tuned", "--mapping", whole, "--corpus", text, "--samples", 4, "--prefix-len", 32)
    assert res.exit_code == 2 and "overlap the mapping's calibration text" in res.stderr
