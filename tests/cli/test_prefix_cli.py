"""`kvbridge split / pack / diverge / ablate`: JSON keys, one-line errors with exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from kvbridge.cli.main import build_cli

CORPUS = ("The quick brown fox jumps over the lazy dog. You are a careful assistant. Answer in a numbered "
          "list, one item per line. Define zorp: a zorp is a small blue fruit that tastes like lemon. "
          "What colour is a zorp? List three fruits.\n") * 30
GUIDE = "Define zorp: a zorp is a small blue fruit that tastes like lemon."
PROMPT = "What colour is a zorp?"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model_dir(folder, *, seed=0, max_positions=96):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(CORPUS.split("\n"), trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>")
    torch.manual_seed(seed)
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=max_positions,
                      initializer_range=0.05)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    return {"root": root, "model": _model_dir(root / "model"), "other": _model_dir(root / "other", seed=1),
            "short": _model_dir(root / "short", max_positions=16)}


def run(*args):
    return CliRunner().invoke(build_cli(), [str(a) for a in args])


def one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in result.output, result.output
    for n in needles:
        assert n in err, err
    return err


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
    res = run("split", shared_dir / "fixtures/tokenizers/gpt2", "--guide", f"@{guide}", "--live", "Bonjour",
              "--sep", "\\n\\n")
    assert res.exit_code == 0 and "naive:" in res.stdout and "safe:" in res.stdout
    res = run("split", shared_dir / "fixtures/tokenizers/gpt2", "--guide", "hel", "--live", "lo", "--sep", "",
              "--json")
    d = json.loads(res.stdout)
    assert res.exit_code == 0 and d["safe_found"] is False and d["reason"]


def test_split_bad_input(tmp_path, dirs):
    one_line_error(run("split", tmp_path / "nope", "--guide", "a", "--live", "b"), "does not exist")
    one_line_error(run("split", tmp_path, "--guide", "a", "--live", "b"), "holds no tokenizer")
    one_line_error(run("split", dirs["model"], "--guide", "", "--live", "b"), "guide is empty")
    one_line_error(run("split", dirs["model"], "--guide", f"@{tmp_path / 'missing.txt'}", "--live", "b"),
                   "cannot read guide file")


# -- pack -----------------------------------------------------------------------------------------
def test_pack_save_info_verify(dirs):
    out = dirs["root"] / "pack"
    res = run("pack", "save", dirs["model"], "--guide", GUIDE, "--out", out)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["kv.safetensors", "manifest.json"]
    info = json.loads(run("pack", "info", out, "--json").stdout)
    assert info["checksum_ok"] and info["manifest"]["guide"]["text"] == GUIDE
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
    one_line_error(run("pack", "save", dirs["model"], "--guide", GUIDE, "--out", out), "already exists")
    data = (out / "kv.safetensors").read_bytes()
    (out / "kv.safetensors").write_bytes(data[:-64])
    one_line_error(run("pack", "info", out), "checksum mismatch")
    one_line_error(run("pack", "verify", out, dirs["model"]), "checksum mismatch")


def test_pack_save_bad_input_writes_nothing(dirs, tmp_path):
    out = tmp_path / "p"
    one_line_error(run("pack", "save", dirs["short"], "--guide", GUIDE, "--out", out), "has 16 positions")
    one_line_error(run("pack", "save", dirs["model"], "--guide", "  ", "--out", out), "guide is empty")
    one_line_error(run("pack", "save", tmp_path / "nomodel", "--guide", GUIDE, "--out", out))
    one_line_error(run("pack", "save", dirs["model"], "--guide", GUIDE, "--out", out, "--tokenizer",
                       tmp_path / "notok"), "does not exist")
    assert not out.exists() and list(tmp_path.iterdir()) == []


# -- diverge / ablate -----------------------------------------------------------------------------
def test_diverge_json(dirs):
    res = run("diverge", dirs["model"], "--guide", GUIDE, "--prompt", PROMPT, "--seeds", 2, "--max-new-tokens", 3,
              "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert {"paths", "sampler", "seeds", "split", "pairs", "greedy", "notes"} <= set(d)
    assert d["paths"] == ["full", "cached", "split", "concat"] and d["seeds"] == [0, 1]
    s = d["pairs"]["cached-vs-split"]["summary"]
    assert s["n"] == 2 and "too few seeds" in s["rate_note"]
    text = run("diverge", dirs["model"], "--guide", GUIDE, "--prompt", PROMPT, "--greedy", "--max-new-tokens", 2)
    assert text.exit_code == 0 and "greedy:" in text.stdout


def test_diverge_with_a_saved_pack_and_bad_input(dirs, tmp_path):
    out = tmp_path / "pack"
    assert run("pack", "save", dirs["model"], "--guide", GUIDE, "--out", out).exit_code == 0
    res = run("diverge", dirs["model"], "--guide", GUIDE, "--prompt", PROMPT, "--seeds", 1, "--max-new-tokens", 2,
              "--pack", out, "--json")
    assert res.exit_code == 0, res.output
    one_line_error(run("diverge", dirs["other"], "--guide", GUIDE, "--prompt", PROMPT, "--pack", out),
                   "weights differ")
    one_line_error(run("diverge", dirs["model"], "--guide", "", "--prompt", PROMPT), "guide is empty")
    one_line_error(run("diverge", dirs["short"], "--guide", GUIDE, "--prompt", PROMPT), "positions")


def test_ablate_json_and_bad_input(dirs):
    res = run("ablate", dirs["model"], "--guide", GUIDE, "--prompt", PROMPT, "--layers", "0-1",
              "--max-new-tokens", 3, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert {"layers", "guide_positions", "conditions", "positions", "notes"} <= set(d)
    assert set(d["conditions"]) == {"intact", "k_zero", "v_zero", "kv_zero", "remove_prefill", "remove_decode",
                                    "recompute"}
    assert {"kl", "top1_changed", "greedy"} <= set(d["conditions"]["k_zero"]["vs_intact"])
    text = run("ablate", dirs["model"], "--guide", GUIDE, "--prompt", PROMPT, "--max-new-tokens", 2)
    assert text.exit_code == 0 and "remove_prefill" in text.stdout
    one_line_error(run("ablate", dirs["model"], "--guide", GUIDE, "--prompt", PROMPT, "--layers", "5"),
                   "out of range")
    one_line_error(run("ablate", dirs["model"], "--guide", "", "--prompt", PROMPT), "guide is empty")


def test_command_modules_import_nothing_heavy():
    code = ("import sys\n"
            "import kvbridge.cli.split_cmd, kvbridge.cli.pack_cmd, kvbridge.cli.diverge_cmd, kvbridge.cli.ablate_cmd\n"
            "import kvbridge.splits, kvbridge.packs, kvbridge.diverge, kvbridge.ablate\n"
            "print('HEAVY', [m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules])")
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
    res = run("diverge", base, "--guide", guide, "--prompt", "All: Speak, speak.", "--seeds", 2,
              "--max-new-tokens", 8, "--pack", out, "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["split"]["matches_joint"] and not rep["split"]["naive_matches_joint"]
    assert all(r["identical"] and r["bitwise_equal_logits"] for r in rep["pairs"]["cached-vs-concat"]["seeds"])
