"""K/V ablations vs true removal: no zeroing equals removal; prefill-time masking does."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kvbridge.prefix.ablate import CONDITIONS, ablate, parse_layers
from kvbridge.errors import KVBridgeError


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return tiny_llama.tok


@pytest.fixture(scope="module")
def model(tiny_llama, tok):
    return tiny_llama.model(tok, num_hidden_layers=3, initializer_range=0.2, attn="sdpa")


# -- layer specs ----------------------------------------------------------------------------------
def test_parse_layers():
    assert parse_layers("all", 4) == (0, 1, 2, 3)
    assert parse_layers("0,2", 4) == (0, 2)
    assert parse_layers("1-3", 4) == (1, 2, 3)
    assert parse_layers("0, 2-3", 4) == (0, 2, 3)
    with pytest.raises(KVBridgeError, match="out of range"):
        parse_layers("4", 4)
    with pytest.raises(KVBridgeError, match="cannot read layer spec"):
        parse_layers("x", 4)
    with pytest.raises(KVBridgeError, match="cannot read layer spec"):
        parse_layers("3-1", 4)


# -- the softmax argument, on one attention head --------------------------------------------------
def test_zeroed_keys_still_take_softmax_weight_and_kv_zero_is_not_removal():
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 1, 1, 8, generator=g),
        torch.randn(1, 1, 6, 8, generator=g),
        torch.randn(1, 1, 6, 8, generator=g),
    )
    guide = slice(1, 4)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    k0 = k.clone()
    k0[:, :, guide] = 0
    scores = (q @ k0.transpose(-1, -2)) / math.sqrt(8)
    weights = torch.softmax(scores, -1)
    assert torch.all(scores[..., guide] == 0)  # q . 0 = 0
    z = torch.exp(scores).sum()
    assert torch.allclose(weights[..., guide], torch.exp(torch.tensor(0.0)) / z)  # weight exp(0) / Z each
    keep = torch.ones(6, dtype=torch.bool)
    keep[guide] = False
    removed = sdpa(q, k, v, attn_mask=keep[None, :])
    v0 = v.clone()
    v0[:, :, guide] = 0
    k_only, kv = sdpa(q, k0, v), sdpa(q, k0, v0)
    assert torch.allclose(k_only, weights @ v)  # the retained values still contribute
    # K+V zero: nothing in the numerator, but exp(0) in the denominator dilutes the kept positions
    assert torch.allclose(kv, removed * (1 - weights[..., guide].sum()), atol=1e-6)
    assert not torch.allclose(kv, removed, atol=1e-3) and not torch.allclose(k_only, removed, atol=1e-3)


# -- on a model -----------------------------------------------------------------------------------
def test_all_layers_only_prefill_masking_equals_recompute(model, tok, tiny_guide, tiny_prompt):
    rep = ablate(model, tok, tiny_guide, tiny_prompt, layers="all", max_new_tokens=8)
    d = rep.to_dict()
    json.dumps(d)
    assert set(d["conditions"]) == set(CONDITIONS) and d["layers"] == [0, 1, 2]
    assert d["guide_positions"] == [1, d["split"]["ghost_len"]]  # BOS kept
    c = d["conditions"]
    assert c["intact"]["vs_intact"]["kl"] == 0 and not c["intact"]["vs_intact"]["top1_changed"]
    assert d["intact_vs_visible_max_abs_logit_diff"] < 1e-5
    assert c["remove_prefill"]["vs_recompute"]["kl"] < 1e-9
    assert c["remove_prefill"]["vs_recompute"]["greedy"]["identical"]
    assert c["remove_prefill"]["vs_recompute"]["max_abs_logit_diff"] < 1e-4
    assert d["positions"]["remove_prefill"] == "renumbered"
    for name in ("k_zero", "v_zero", "kv_zero", "remove_decode", "intact"):
        assert c[name]["vs_recompute"]["kl"] > 1e-4, name  # none of these is removal
        assert c[name]["vs_recompute"]["max_abs_logit_diff"] > 1e-3, name
    for name in ("k_zero", "v_zero", "kv_zero", "remove_prefill", "remove_decode", "recompute"):
        assert c[name]["vs_intact"]["kl"] > 1e-4, name  # every condition changes something
    assert len(c["kv_zero"]["tokens"]) == 8 and 0 <= c["kv_zero"]["vs_intact"]["greedy"]["agreement"] <= 1
    assert any("exp(0)" in n for n in d["notes"])
    assert rep.lines()[0].startswith("guide positions 1-")


def test_some_layers_keep_positions_and_last_layer_masking_is_the_same_at_prefill_or_decode(
    model, tok, tiny_guide, tiny_prompt
):
    rep = ablate(model, tok, tiny_guide, tiny_prompt, layers="0", max_new_tokens=4)
    assert rep.positions["remove_prefill"] == "kept"
    c = rep.conditions
    assert c["remove_prefill"]["vs_recompute"]["kl"] > 1e-4
    # masking layer 0 at prefill changes the live tokens' K/V of layers 1-2; at decode time it does not
    assert abs(c["remove_prefill"]["vs_intact"]["kl"] - c["remove_decode"]["vs_intact"]["kl"]) > 1e-6
    last = ablate(model, tok, tiny_guide, tiny_prompt, layers="2", max_new_tokens=4).conditions
    # no later layer reads the last layer's outputs, so prefill- and decode-time masking coincide there
    assert last["remove_prefill"]["vs_intact"]["kl"] == pytest.approx(
        last["remove_decode"]["vs_intact"]["kl"], abs=1e-12
    )


def test_eager_attention_and_absolute_positions(tok, tiny_llama, tiny_guide, tiny_prompt):
    from transformers import AutoModelForCausalLM, GPT2Config

    eager = tiny_llama.model(tok, num_hidden_layers=2, initializer_range=0.2, attn="eager")
    c = ablate(eager, tok, tiny_guide, tiny_prompt, max_new_tokens=4).conditions
    assert c["remove_prefill"]["vs_recompute"]["kl"] < 1e-9 and c["kv_zero"]["vs_recompute"]["kl"] > 1e-4
    torch.manual_seed(0)
    gpt2 = AutoModelForCausalLM.from_config(
        GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=96, vocab_size=len(tok), initializer_range=0.2)
    ).eval()
    c = ablate(gpt2, tok, tiny_guide, tiny_prompt, max_new_tokens=4).conditions
    assert c["remove_prefill"]["vs_recompute"]["kl"] < 1e-9 and c["remove_decode"]["vs_recompute"]["kl"] > 1e-4


def test_bad_inputs(model, tok, tiny_guide, tiny_prompt):
    with pytest.raises(KVBridgeError, match="out of range"):
        ablate(model, tok, tiny_guide, tiny_prompt, layers="7")
    with pytest.raises(KVBridgeError, match="exceed the model's 96 positions"):
        ablate(model, tok, tiny_guide, tiny_prompt, max_new_tokens=90)
    with pytest.raises(KVBridgeError, match="guide is empty"):
        ablate(model, tok, " ", tiny_prompt)
