"""The real pretrained model through kvbridge's exact paths (see tests/real/conftest.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real


def test_gguf_describe_facts(smollm2_ref):
    from kvbridge.models.gguf import geometry

    geo = geometry(smollm2_ref.gguf)
    assert (geo["layers"], geo["heads"], geo["kv_heads"], geo["head_dim"]) == (30, 9, 3, 64)
    assert geo["tied_embeddings"] and geo["chat_template"] and geo["quantization"] == "Q4_1"
    spec = smollm2_ref.spec()
    assert spec.model_type == "llama" and spec.num_kv_heads == 3 and spec.rope.theta == 100000.0
    fp = smollm2_ref.fingerprint()
    assert fp["quantization"] == "Q4_1" and fp["files"] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]


def test_loaded_model_matches_its_header(smollm2, smollm2_ref):
    assert smollm2.spec.num_layers == 30 and smollm2.spec.dtype == "float32"
    assert smollm2.model.config.tie_word_embeddings
    assert smollm2.ref.tokenizer().vocab_size == len(smollm2.tokenizer) == 49152


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_identity_transfer_is_bitwise_on_the_real_weights(smollm2, dtype):
    """The transferred state is the extracted one bit for bit, and the continuation from it has the
    very tokens and logits of the model's own cached continuation: no threshold, so no CPU's
    kernels can move it (the model's own noise is reported by the check, never asserted on)."""
    from kvbridge.demo.real import cast, chat_texts, identity_check

    lm = smollm2 if dtype == "float32" else cast(smollm2, dtype)
    guide, live = chat_texts(lm.tokenizer)
    ids = lm.tokenizer(guide + live, add_special_tokens=False)["input_ids"]
    res = identity_check(lm.model, ids, new_tokens=6)
    print(res)
    assert res.state_equal and res.tokens_equal and res.max_logit_diff == 0.0, res
    assert res.exact


def test_exact_token_split_on_the_chat_template(smollm2):
    from kvbridge.demo.real import chat_split, chat_texts

    guide, live = chat_texts(smollm2.tokenizer)
    assert guide.startswith("<|im_start|>system") and live.lstrip().startswith("<|im_start|>user")
    report = chat_split(smollm2.tokenizer)
    assert report.safe is not None and report.safe.ids == report.joint
    assert report.safe.ghost_text == guide


def test_pack_restores_with_zero_forwards(smollm2, tmp_path):
    from kvbridge.demo.real import pack_check

    res = pack_check(smollm2.model, smollm2.tokenizer, new_tokens=6, folder=str(tmp_path / "pack"))
    assert res.forwards_during_restore == 0 and res.guide_tokens > 10
    assert res.tokens_equal and res.max_logit_diff == 0.0, res  # bitwise: the guide's own cache, restored


def test_diverge_on_the_real_tokenizer(smollm2):
    from kvbridge.demo.real import chat_texts
    from kvbridge.prefix.diverge import diverge

    guide, live = chat_texts(smollm2.tokenizer)
    report = diverge(
        smollm2.model,
        smollm2.tokenizer,
        guide,
        live,
        sep="",
        seeds=2,
        max_new_tokens=6,
        paths=["cached", "split", "concat"],
    )
    data = report.to_dict()
    assert data["split"]["matches_joint"] is True
    greedy = {tuple(sorted(k.split("-vs-"))): v for k, v in data["greedy"].items()}
    same = greedy[("cached", "concat")]  # the exact split's ids fed visibly == the joint prefill
    assert same["identical"] and same["bitwise_equal_logits"], same
    restored = greedy[("cached", "split")]  # the guide from a pack, the live part prefilled after it
    assert restored["identical"] and restored["max_abs_logit_diff_shared_steps"] < 1e-3, restored
    assert data["pairs"][next(iter(data["pairs"]))]["summary"]["n"] == 2
