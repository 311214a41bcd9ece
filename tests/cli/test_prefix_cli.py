"""`kvbridge split / pack / diverge / ablate`: JSON keys, one-line errors with exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvbridge.testing.cli import one_line_error, run_cli as run


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tiny_llama):
    root = tmp_path_factory.mktemp("cli")
    return {
        "root": root,
        "model": tiny_llama.model_dir(root / "model"),
        "other": tiny_llama.model_dir(root / "other", seed=1),
        "short": tiny_llama.model_dir(root / "short", max_position_embeddings=16),
    }


# -- split ----------------------------------------------------------------------------------------
def test_split_json_on_real_tokenizers(shared_dir):
    base = shared_dir / "fixtures" / "tokenizers"
    for path in (base / "qwen2.5", base / "gpt2", base / "llama2-sentencepiece", base / "mistral" / "tokenizer.json"):
        res = run("split", path, "--guide", "You are a careful assistant.", "--live", "List three fruits.", "--json")
        assert res.exit_code == 0, res.output
        d = json.loads(res.stdout)
        assert isinstance(d["joint"], list) and d["naive"]["matches_joint"] is False
        assert d["safe"]["matches_joint"] is True and d["safe"]["ghost"] + d["safe"]["live"] == d["joint"]
        for k in ("naive", "safe"):
            assert {"ghost", "live", "matches_joint"} <= set(d[k])


def test_split_text_output_and_escapes(shared_dir, tmp_path):
    guide = tmp_path / "guide.txt"
    guide.write_text("Answer in French.")
    res = run(
        "split", shared_dir / "fixtures/tokenizers/gpt2", "--guide", f"@{guide}", "--live", "Bonjour", "--sep", "\\n\\n"
    )
    assert res.exit_code == 0 and "naive:" in res.stdout and "safe:" in res.stdout
    res = run("split", shared_dir / "fixtures/tokenizers/gpt2", "--guide", "hel", "--live", "lo", "--sep", "", "--json")
    d = json.loads(res.stdout)
    assert res.exit_code == 0 and d["safe_found"] is False and d["reason"]


def test_split_bad_input(tmp_path, dirs):
    one_line_error(run("split", tmp_path / "nope", "--guide", "a", "--live", "b"), "does not exist")
    one_line_error(run("split", tmp_path, "--guide", "a", "--live", "b"), "holds no tokenizer")
    one_line_error(run("split", dirs["model"], "--guide", "", "--live", "b"), "guide is empty")
    one_line_error(
        run("split", dirs["model"], "--guide", f"@{tmp_path / 'missing.txt'}", "--live", "b"), "cannot read guide file"
    )


# -- pack -----------------------------------------------------------------------------------------
def test_pack_save_info_verify(dirs, tiny_guide):
    out = dirs["root"] / "pack"
    res = run("pack", "save", dirs["model"], "--guide", tiny_guide, "--out", out)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == [".kvbridge-artifact.json", "kv.safetensors", "manifest.json"]
    info = json.loads(run("pack", "info", out, "--json").stdout)
    assert info["checksum_ok"] and info["manifest"]["guide"]["text"] == tiny_guide
    assert "checksum   ok" in run("pack", "info", out).stdout
    res = run("pack", "verify", out, dirs["model"], "--json", "--recompute")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["ok"] and d["cache_tokens"] == d["num_tokens"] and d["recompute_max_abs_diff"] == 0.0
    # another model (same architecture, other weights) is refused naming the field; --force loads loudly
    one_line_error(run("pack", "verify", out, dirs["other"]), "weights differ", "--force")
    forced = run("pack", "verify", out, dirs["other"], "--force")
    assert forced.exit_code == 0 and "WARNING" in forced.stderr and "--force" in forced.stdout
    # a pack is not overwritten; a truncated one is refused by checksum
    one_line_error(run("pack", "save", dirs["model"], "--guide", tiny_guide, "--out", out), "already exists")
    data = (out / "kv.safetensors").read_bytes()
    (out / "kv.safetensors").write_bytes(data[:-64])
    one_line_error(run("pack", "info", out), "checksum mismatch")
    one_line_error(run("pack", "verify", out, dirs["model"]), "checksum mismatch")


def test_pack_save_bad_input_writes_nothing(dirs, tmp_path, tiny_guide):
    out = tmp_path / "p"
    one_line_error(run("pack", "save", dirs["short"], "--guide", tiny_guide, "--out", out), "has 16 positions")
    one_line_error(run("pack", "save", dirs["model"], "--guide", "  ", "--out", out), "guide is empty")
    one_line_error(run("pack", "save", tmp_path / "nomodel", "--guide", tiny_guide, "--out", out))
    one_line_error(
        run("pack", "save", dirs["model"], "--guide", tiny_guide, "--out", out, "--tokenizer", tmp_path / "notok"),
        "does not exist",
    )
    assert not out.exists() and list(tmp_path.iterdir()) == []


# -- diverge / ablate -----------------------------------------------------------------------------
def test_diverge_json(dirs, tiny_guide, tiny_prompt):
    res = run(
        "diverge",
        dirs["model"],
        "--guide",
        tiny_guide,
        "--prompt",
        tiny_prompt,
        "--seeds",
        2,
        "--max-new-tokens",
        3,
        "--json",
    )
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert {"paths", "sampler", "seeds", "split", "pairs", "greedy", "notes"} <= set(d)
    assert d["paths"] == ["full", "cached", "split", "concat"] and d["seeds"] == [0, 1]
    s = d["pairs"]["cached-vs-split"]["summary"]
    assert s["n"] == 2 and "too few seeds" in s["rate_note"]
    text = run(
        "diverge", dirs["model"], "--guide", tiny_guide, "--prompt", tiny_prompt, "--greedy", "--max-new-tokens", 2
    )
    assert text.exit_code == 0 and "greedy:" in text.stdout


def test_diverge_with_a_saved_pack_and_bad_input(dirs, tmp_path, tiny_guide, tiny_prompt):
    out = tmp_path / "pack"
    assert run("pack", "save", dirs["model"], "--guide", tiny_guide, "--out", out).exit_code == 0
    res = run(
        "diverge",
        dirs["model"],
        "--guide",
        tiny_guide,
        "--prompt",
        tiny_prompt,
        "--seeds",
        1,
        "--max-new-tokens",
        2,
        "--pack",
        out,
        "--json",
    )
    assert res.exit_code == 0, res.output
    one_line_error(
        run("diverge", dirs["other"], "--guide", tiny_guide, "--prompt", tiny_prompt, "--pack", out), "weights differ"
    )
    one_line_error(run("diverge", dirs["model"], "--guide", "", "--prompt", tiny_prompt), "guide is empty")
    one_line_error(run("diverge", dirs["short"], "--guide", tiny_guide, "--prompt", tiny_prompt), "positions")


def test_ablate_json_and_bad_input(dirs, tiny_guide, tiny_prompt):
    res = run(
        "ablate",
        dirs["model"],
        "--guide",
        tiny_guide,
        "--prompt",
        tiny_prompt,
        "--layers",
        "0-1",
        "--max-new-tokens",
        3,
        "--json",
    )
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert {"layers", "guide_positions", "conditions", "positions", "notes"} <= set(d)
    assert set(d["conditions"]) == {
        "intact",
        "k_zero",
        "v_zero",
        "kv_zero",
        "remove_prefill",
        "remove_decode",
        "recompute",
    }
    assert {"kl", "top1_changed", "greedy"} <= set(d["conditions"]["k_zero"]["vs_intact"])
    text = run("ablate", dirs["model"], "--guide", tiny_guide, "--prompt", tiny_prompt, "--max-new-tokens", 2)
    assert text.exit_code == 0 and "remove_prefill" in text.stdout
    one_line_error(
        run("ablate", dirs["model"], "--guide", tiny_guide, "--prompt", tiny_prompt, "--layers", "5"), "out of range"
    )
    one_line_error(run("ablate", dirs["model"], "--guide", "", "--prompt", tiny_prompt), "guide is empty")


def test_command_modules_import_nothing_heavy():
    code = (
        "import sys\n"
        "import kvbridge.cli.split_cmd, kvbridge.cli.pack_cmd, kvbridge.cli.diverge_cmd, kvbridge.cli.ablate_cmd\n"
        "import kvbridge.prefix.splits, kvbridge.prefix.packs, kvbridge.prefix.diverge, kvbridge.prefix.ablate\n"
        "print('HEAVY', [m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules])"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "HEAVY []" in res.stdout


def _zoo(*names):
    from kvbridge.zoo import zoo_dir

    folders = [zoo_dir() / n for n in names]
    missing = [f for f in folders if not (f / "model.safetensors").is_file()]
    if missing:
        pytest.skip(f"zoo model(s) not built: {', '.join(str(m) for m in missing)}")
    return folders


def test_zoo_models_pack_round_trip_and_refusals(tmp_path):
    """A trained model: pack save/verify on `base`, refused for its fine-tune and for another geometry."""
    base, tuned, odd = _zoo("base", "tuned", "odd")
    guide = "First Citizen: Before we proceed any further, hear me speak."
    out = tmp_path / "pack"
    assert run("pack", "save", base, "--guide", guide, "--out", out).exit_code == 0
    d = json.loads(run("pack", "verify", out, base, "--json", "--recompute").stdout)
    assert d["ok"] and d["recompute_max_abs_diff"] == 0.0
    one_line_error(run("pack", "verify", out, tuned), "weights differ")
    one_line_error(run("pack", "verify", out, odd), "model differs")
    res = run(
        "diverge",
        base,
        "--guide",
        guide,
        "--prompt",
        "All: Speak, speak.",
        "--seeds",
        2,
        "--max-new-tokens",
        8,
        "--pack",
        out,
        "--json",
    )
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["split"]["matches_joint"] and not rep["split"]["naive_matches_joint"]
    assert all(r["identical"] and r["bitwise_equal_logits"] for r in rep["pairs"]["cached-vs-concat"]["seeds"])
