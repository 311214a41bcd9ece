"""The llamacpp engine against a running llama.cpp (llama-cpp-python 0.3.36) on the real SmolLM2
Q4_1 GGUF, and transformers on the same GGUF dequantized (fixtures in tests/real/conftest.py).

Bounds are reasons, not this machine's numbers: the model's own noise (transformers float32 vs
llama.cpp's quantized kernels on the same prompt) is measured in the same run and scales the
checks; greedy tokens are compared up to the first near tie that noise could flip
(:func:`tools.llamacpp_check.agreement`); each check has a control that a wrong
cache (keys left in transformers' rotary layout) fails.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.real, pytest.mark.slow]

#: a prompt whose greedy continuation has no near tie in its first steps (top-2 margins of 6.6, 14.7,
#: 10.4 ... logits, against a noise of ~0.7), so the token comparison covers them
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +"


def _ids(lm, text=PROMPT):
    return lm.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_llama_cpp_continues_from_kvbridges_export(smollm2, llama_session, monkeypatch):
    """transformers' cache of the prompt, exported, loaded into llama.cpp, continued: the same greedy
    tokens as llama.cpp's own prefill, and a first-step logit difference of the order of the
    model's own noise. The difference comes only from the cache (transformers float32 K/V rounded
    to F16 vs llama.cpp's K/V from 8-bit-quantized activations), a part of what separates the two
    implementations' logits, so twice the noise bounds it; keys left in the wrong rotary layout
    break it by far more."""
    from kvbridge.engines import llamacpp as L
    from tools.llamacpp_check import continuation_check

    res = continuation_check(smollm2, llama_session, _ids(smollm2), new_tokens=8)
    print(res)
    assert res.own_reload_diff == 0.0  # llama.cpp's own state, saved and reloaded: bitwise
    assert res.tokens_equal and res.compared >= 1, res
    assert res.first_step_diff <= 2 * res.noise, res
    monkeypatch.setitem(L.ENGINE_INTERLEAVED, "llama", False)  # control: no layout permutation
    wrong = continuation_check(smollm2, llama_session, _ids(smollm2), new_tokens=2)
    print("without the permutation:", wrong.first_step_diff, wrong.ours_tokens)
    assert wrong.first_step_diff > 2 * res.noise


def test_llama_cpps_cache_reads_back_as_transformers_cache(smollm2, llama_session):
    """llama.cpp's saved cache, imported, against transformers' cache of the same prompt: per layer
    relative error within what llama.cpp's 8-bit activations and F16 storage explain (layer 0's
    keys come from one quantized matmul: ~1%; deeper layers compound it: under 15%), where keys in
    the wrong layout are uncorrelated (~sqrt 2). Handed to transformers, the imported cache
    continues like transformers' own prefill."""
    from tools.llamacpp_check import import_check

    res = import_check(smollm2, llama_session, _ids(smollm2), new_tokens=8)
    print(res)
    assert len(res.key_rel_err) == 30
    assert res.key_rel_err[0] < 0.02
    assert max(res.key_rel_err) < 0.15 and max(res.value_rel_err) < 0.15, res
    assert res.key_rel_err_unpermuted > 1.0
    assert res.tokens_equal and res.compared >= 1, res
    assert res.first_step_diff <= 2 * res.noise, res


def test_llama_cpps_cache_round_trips_through_a_kvstate_exactly(smollm2, llama_session):
    """llama.cpp -> KVState -> llama.cpp: F16 widened to float32 and rounded back is exact (and the
    permutation is undone), so the re-exported file is llama.cpp's own byte for byte and llama.cpp
    continues from it bitwise as from its own save."""
    from tools.llamacpp_check import roundtrip_check

    res = roundtrip_check(llama_session, _ids(smollm2), new_tokens=4)
    print(res)
    assert res.same_bytes and res.reload_diff == 0.0 and res.tokens_equal, res


def test_a_pack_restored_into_llama_cpp_skips_the_guide_prefill(smollm2, llama_session, tmp_path):
    """`kvbridge pack export` of a SmolLM2 pack, loaded by llama.cpp with no prefill of the guide,
    then the live turn decoded: llama.cpp's greedy tokens after its own prefill of guide + live."""
    import json

    from click.testing import CliRunner

    from kvbridge.cli.main import cli
    from kvbridge.demo.real import chat_texts
    from tools.llamacpp_check import continuation_check, pack_check
    from kvbridge.prefix.packs import guide_ids_of, save_pack

    tok = smollm2.tokenizer
    guide, live = chat_texts(tok)
    guide_ids = guide_ids_of(tok, guide)
    live_ids = tok(live, add_special_tokens=False)["input_ids"]
    assert tok(guide + live, add_special_tokens=False)["input_ids"] == guide_ids + live_ids
    save_pack(smollm2.model, tmp_path / "pack", guide_text=guide, guide_ids=guide_ids, tokenizer=tok)
    out = tmp_path / "guide.llamacpp-seq"
    r = CliRunner().invoke(
        cli,
        [
            "pack",
            "export",
            str(tmp_path / "pack"),
            "--engine",
            "llamacpp",
            "--model",
            llama_session.path,
            "--out",
            str(out),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["tokens"] == len(guide_ids)
    assert llama_session.load_state(out) == len(guide_ids)
    noise = continuation_check(smollm2, llama_session, guide_ids + live_ids, new_tokens=1).noise
    res = pack_check(str(tmp_path / "pack"), llama_session, guide_ids, live_ids, noise=noise, new_tokens=8)
    print(res, "saved s:", res.saved_s)
    assert res.tokens_equal, res  # up to the first near tie (the chat's first token may be one)
    assert res.first_step_diff <= 2 * noise


def test_llama_cpp_refuses_a_state_for_another_context_and_kvbridge_says_so(smollm2, llama_session, tmp_path):
    from click.testing import CliRunner

    from kvbridge.cli.main import cli
    from kvbridge.engines import llamacpp as L
    from kvbridge.errors import StateError

    ids = _ids(smollm2)[:12]
    llama_session.prefill(ids)
    own = tmp_path / "own.llamacpp-seq"
    llama_session.save_state(own)
    imported = L.import_state(own, llama_session.path)
    flipped = L.export_state(imported, llama_session.path, v_trans=not llama_session.v_trans)
    with pytest.raises(StateError, match="llama.cpp refused the sequence state") as exc:
        llama_session.load_state(flipped)
    assert "\n" not in str(exc.value)
    runner = CliRunner()
    r = runner.invoke(cli, ["engine", "import", str(own), llama_session.path])
    assert r.exit_code == 0 and "12 tokens" in r.output and "version 3" in r.output, r.output
    cut = tmp_path / "cut.llamacpp-seq"
    cut.write_bytes(own.read_bytes()[:-100])
    r = runner.invoke(cli, ["engine", "import", str(cut), llama_session.path])
    assert r.exit_code == 2 and "truncated llama.cpp state file" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_transfer_continues_in_llama_cpp_from_the_moved_cache(smollm2):
    """``kvbridge transfer ... --engine llamacpp --compare``: the identity transfer of SmolLM2's cache is
    loaded into llama.cpp, which continues; llama.cpp's own prefill of the same prompt is the reference
    (the greedy tokens agree up to the first near tie the model's own noise could flip)."""
    from click.testing import CliRunner

    from kvbridge.cli.main import cli

    res = CliRunner().invoke(
        cli,
        [
            "transfer",
            "smollm2",
            "smollm2",
            "--mapping",
            "identity",
            "--engine",
            "llamacpp",
            "--compare",
            "--max-new-tokens",
            "4",
            "--prompt",
            PROMPT,
        ],
    )
    assert res.exit_code == 0, res.output
    assert "llamacpp: transferred" in res.output and "llamacpp native:" in res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("[agreement"))
    same, n = line.split()[1].split("/")
    assert int(n) == 4 and int(same) >= 1, line  # the prompt has no near tie in its first steps (see PROMPT)
