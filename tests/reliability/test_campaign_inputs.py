"""Campaign, class "bad input": every out-of-range number, malformed config and bad text is one
line on stderr, exit 2, and writes nothing."""

from __future__ import annotations

import json

import pytest

NAN, INF = float("nan"), float("inf")

# -- fit options (refused before any model is loaded) ------------------------------------------------------
FIT_OPTIONS = [
    (["--seq-len", "0"], "--seq-len"),
    (["--seq-len", "1"], "--seq-len"),
    (["--seq-len", "-4"], "--seq-len"),
    (["--seq-len", "5000"], "maximum positions"),  # the tiny models have 96
    (["--tokens", "-5"], "--tokens"),
    (["--tokens", "0"], "--tokens"),
    (["--stride", "0"], "--stride"),
    (["--stride", "-2"], "--stride"),
    (["--stride", "40"], "--stride"),  # larger than a 32-token sequence
    (["--skip", "-1"], "--skip"),
    (["--top-k", "0"], "--top-k"),
    (["--top-k", "9"], "--top-k"),  # the source has 2 layers
    (["--alpha", "-1"], "--alpha"),
    (["--alpha", "nan"], "--alpha"),
    (["--alpha", "inf"], "--alpha"),
    (["--alpha", "-inf"], "--alpha"),
    (["--alpha", "abc"], "--alpha"),
    (["--memory", "nan"], "--memory"),
    (["--memory", "inf"], "--memory"),
    (["--memory", "-1"], "--memory"),
    (["--memory", "0"], "--memory"),
    (["--batch-size", "0"], "--batch-size"),
    (["--seq-len", "abc"], "--seq-len"),
    (["--tokens", "1.5"], "--tokens"),
    (["--bogus-option"], "bogus"),
    (["--dtype", "float8"], "--dtype"),
    (["--heldout", "1.5"], "--heldout"),
    (["--fitter", "no-such-fitter"], "no-such-fitter"),
]


@pytest.mark.parametrize("extra,needle", FIT_OPTIONS, ids=[" ".join(a) for a, _ in FIT_OPTIONS])
def test_fit_option_refused(world, tmp_path, c, extra, needle):
    out = tmp_path / "m"
    args = world.fit_args(out)
    for i in range(0, len(extra), 2):  # replace defaults given by fit_args, else append
        if extra[i] in args and i + 1 < len(extra):
            args[args.index(extra[i]) + 1] = extra[i + 1]
        else:
            args.extend(extra[i : i + 2])
    c.error(c.cli(args), needle)
    assert not out.exists() and not c.leftovers(tmp_path)


def test_fit_default_top_k_is_what_check_assumes():
    from kvbridge.builtin.compat_checks import TOP_K
    from kvbridge.fit.calibrate import DEFAULT_TOP_K
    from kvbridge.fit.ridge import RidgeOptions

    assert RidgeOptions().top_k == DEFAULT_TOP_K == TOP_K


# -- corpus and text inputs -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content,needle",
    [
        (b"caf\xe9 au lait\n" * 50, "utf-8"),
        (b"\xff\xfe\x00t\x00e\x00x\x00t", "utf-8"),
        (b"   \n\n  ", "empty"),
        (b"", "empty"),
    ],
    ids=["latin1", "utf16", "blank", "empty"],
)
def test_fit_bad_corpus(world, tmp_path, c, content, needle):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(content)
    args = world.fit_args(tmp_path / "m")
    args[args.index("--corpus") + 1] = corpus
    c.error(c.cli(args), needle)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "line,needle",
    [(b"not json\n", "JSON"), (b'{"txt": "x"}\n', "text"), (b"[1, 2]\n", "text"), (b"[" * 5000 + b"\n", "")],
)
def test_fit_bad_jsonl_corpus(world, tmp_path, c, line, needle):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(line)
    args = world.fit_args(tmp_path / "m")
    args[args.index("--corpus") + 1] = corpus
    c.error(c.cli(args), needle)


def test_fit_missing_corpus(world, tmp_path, c):
    args = world.fit_args(tmp_path / "m")
    args[args.index("--corpus") + 1] = tmp_path / "nope.txt"
    c.error(c.cli(args), "nope.txt")


LIVE = {"split": "--live", "diverge": "--prompt"}


@pytest.mark.parametrize("cmd", ["split", "diverge"])
@pytest.mark.parametrize("bad", ["caf\udce9", "\udcff\udcfe", "ok \udc80 then"], ids=["e9", "fffe", "80"])
def test_invalid_utf8_prompt_bytes(world, c, cmd, bad):
    args = [cmd, world.src, "--guide", world.guide, LIVE[cmd], bad]
    c.error(c.cli(args), "utf-8")


@pytest.mark.parametrize("cmd", ["split", "diverge"])
def test_invalid_utf8_prompt_file(world, tmp_path, c, cmd):
    f = tmp_path / "prompt.txt"
    f.write_bytes(b"caf\xe9")
    c.error(c.cli([cmd, world.src, "--guide", world.guide, LIVE[cmd], f"@{f}"]), LIVE[cmd][2:])


def test_invalid_utf8_argv_in_a_real_process(world):
    """Real argv bytes (not a str): the shell passes them undecodable."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvbridge",
            "split",
            str(world.src),
            "--guide",
            world.guide.encode(),
            "--live",
            b"caf\xe9",
        ],
        capture_output=True,
        env=env,
    )
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 2 and "Traceback" not in err and err.count("\n") == 1 and "UTF-8" in err, err


def test_prompt_longer_than_max_positions(world, c):
    long_prompt = " ".join(["zorp"] * 400)  # the tiny models have 96 positions
    c.error(c.cli(["diverge", world.src, "--guide", world.guide, "--prompt", long_prompt]), "positions")
    c.error(c.cli(["diverge", world.src, "--guide", long_prompt, "--prompt", world.prompt]), "positions")


def test_guide_longer_than_max_positions_for_a_pack(world, tmp_path, c):
    out = tmp_path / "p"
    c.error(c.cli(["pack", "save", world.src, "--guide", " ".join(["zorp"] * 400), "--out", out]), "positions")
    assert not out.exists()


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_diverge_max_new_tokens(world, c, value):
    c.error(
        c.cli(["diverge", world.src, "--guide", world.guide, "--prompt", world.prompt, "--max-new-tokens", value]),
        "--max-new-tokens",
    )


@pytest.mark.parametrize(
    "opt,value,needle",
    [
        ("--temperature", "nan", "temperature"),
        ("--temperature", "0", "temperature"),
        ("--temperature", "-inf", "temperature"),
        ("--top-p", "nan", "top-p"),
        ("--top-p", "1.5", "top-p"),
        ("--seeds", "-1", "--seeds"),
        ("--paths", "full", "paths"),
        ("--split", "weird", "--split"),
    ],
)
def test_diverge_options(world, c, opt, value, needle):
    c.error(c.cli(["diverge", world.src, "--guide", world.guide, "--prompt", world.prompt, opt, value]), needle)


@pytest.mark.parametrize(
    "opt,value,needle",
    [
        ("--samples", "1", "--samples"),
        ("--heldout-fraction", "nan", "--heldout-fraction"),
        ("--prefix-len", "0", "--prefix-len"),
        ("--continuation-len", "0", "--continuation-len"),
        ("--heldout-fraction", "0", "--heldout-fraction"),
        ("--heldout-fraction", "2", "--heldout-fraction"),
        ("--gate", "kl_p95~0.2", "gate"),
        ("--conditions", "native,bogus", "bogus"),
        ("--top-p", "nan", "--top-p"),
        ("--batch-size", "0", "--batch-size"),
    ],
)
def test_eval_options(world, c, opt, value, needle):
    args = ["eval", world.src, world.tgt, "--mapping", "identity", "--corpus", world.corpus, opt, value]
    c.error(c.cli(args), needle)


# -- configs: RoPE and sizes (describe / check read configs without weights) -------------------------------
ROPE_CASES = [
    ({"rope_theta": -1.0}, "rope_theta"),
    ({"rope_theta": 0}, "rope_theta"),
    ({"rope_theta": NAN}, "rope_theta"),
    ({"rope_theta": INF}, "rope_theta"),
    ({"rope_theta": "10000"}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -5.0}}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": NAN}}, "rope_theta"),
    ({"rope_scaling": {"rope_type": "warp-drive", "factor": 2.0}}, "warp-drive"),
    ({"rope_scaling": {"type": "bogus", "factor": 2.0}}, "bogus"),
    ({"rope_scaling": {"rope_type": "linear"}}, "factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": -2.0}}, "factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": True}}, "factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": NAN}}, "factor"),
    ({"rope_scaling": {"rope_type": "dynamic"}}, "factor"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": -1}}, "factor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": "eight"}}, "factor"),
    ({"rope_scaling": "linear"}, "rope_scaling"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"num_hidden_layers": -2}, "num_hidden_layers"),
    ({"hidden_size": "32"}, "hidden_size"),
]


@pytest.mark.parametrize("changes,needle", ROPE_CASES, ids=[json.dumps(c_)[:40] for c_, _ in ROPE_CASES])
@pytest.mark.parametrize("cmd", ["describe", "check"])
def test_bad_config_fields(world, tmp_path, c, changes, needle, cmd):
    folder = tmp_path / "model"
    folder.mkdir()
    cfg = json.loads((world.src / "config.json").read_text())
    if "rope_scaling" in changes or ("rope_parameters" not in changes and "rope_theta" in changes):
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.get("rope_theta", 10000.0)}
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))  # NaN/Infinity as Python writes them
    args = ["describe", folder] if cmd == "describe" else ["check", folder, world.src]
    c.error(c.cli(args), needle)


@pytest.mark.parametrize("depth", [100, 5000, 200_000])
def test_deeply_nested_config(world, tmp_path, c, depth):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * depth + "]" * depth + "}")
    c.error(c.cli(["describe", folder]), "config.json")


@pytest.mark.parametrize(
    "raw,needle",
    [
        (b"\xff\xfe{}", "config.json"),
        (b'{"model_type": ', "config.json"),
        (b"[]", "config.json"),
        (b"null", "config.json"),
    ],
)
def test_garbage_config(tmp_path, c, raw, needle):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_bytes(raw)
    c.error(c.cli(["describe", folder]), needle)


def test_deeply_nested_model_manifest(tmp_path, c, monkeypatch):
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    (mdir / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    monkeypatch.setenv("KVBRIDGE_MANIFEST_PATH", str(mdir))
    c.error(c.cli(["describe", "--list"]), "deep.json")
