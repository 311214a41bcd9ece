"""Reading and building transformers caches: sparse-attention indexer keys, MiniMax's own cache.

DeepSeek-V3.2-style models cache, beside the MLA latent and RoPE key, one indexer key per token
(``[B, T, index_head_dim]``) that picks the top-k tokens each query attends to. These tests
build tiny random models (``index_topk`` 8 < the prompt, so the selection really prunes) and check
that the keys are carried whole: an identity transfer is exact, and a state whose indexer keys are
dropped, corrupted, re-positioned wrongly or mapped from another model is caught.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from kvbridge.builtin.families import hf_cache
from kvbridge.conformance import tiny
from kvbridge.errors import StateError
from kvbridge.plugins import make_host
from kvbridge.testing.contract import check_identity_transfer

HOST = make_host(entry_points=False)
_MODELS: dict = {}


def _tiny(model_type: str):
    if model_type not in _MODELS:
        data = tiny.tiny_config_dict(model_type)
        model = tiny.build(data, 0)
        adapter = HOST.adapter_for(data)
        _MODELS[model_type] = (model, adapter, adapter.spec_of(model))
    return _MODELS[model_type]


def _ids(n: int, seed: int = 1):
    return torch.randint(3, 200, (1, n), generator=torch.Generator().manual_seed(seed))


def _next_logits(model, adapter, state, next_ids):
    """Logits of ``next_ids`` continued from ``state`` injected into ``model``'s cache."""
    cache = adapter.inject(state, model)
    pos = torch.arange(state.num_tokens, state.num_tokens + next_ids.shape[1])[None]
    with torch.no_grad():
        return model(input_ids=next_ids, cache=cache, position_ids=pos, use_cache=True).logits


def _own_logits(model, ids, n_prefix):
    """The model's own cached continuation: its prefill of the prefix, then the rest."""
    model = copy.deepcopy(model)
    cache = hf_cache.reference_cache(model)
    with torch.no_grad():
        model(input_ids=ids[:, :n_prefix], cache=cache, use_cache=True)
        pos = torch.arange(n_prefix, ids.shape[1])[None]
        return model(input_ids=ids[:, n_prefix:], cache=cache, position_ids=pos, use_cache=True).logits


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_identity_transfer_is_exact_with_the_indexer_keys(model_type):
    model, adapter, spec = _tiny(model_type)
    assert spec.indexer_layers == tuple(range(spec.num_layers)) and spec.indexer_dim() == 16
    res = check_identity_transfer(adapter, None, model=model, prompt_len=12, new_tokens=4, tol=1e-5, host=HOST)
    assert res.tokens_equal and res.max_logit_diff <= 1e-5


def test_extract_carries_the_indexer_keys_of_the_model_cache():
    model, adapter, spec = _tiny("deepseek_v32")
    ids = _ids(12)
    state = adapter.extract(copy.deepcopy(model), ids)
    own = hf_cache.new_cache(model)
    with torch.no_grad():
        copy.deepcopy(model)(input_ids=ids, cache=own, use_cache=True)
    assert [i for i, _ in state.indexer_keys] == list(spec.indexer_layers)
    for i, t in state.indexer_keys:
        assert torch.equal(t, own.layers[i].indexer_keys) and tuple(t.shape) == (1, 12, 16)
    assert state.nbytes() == sum(t.numel() * 4 for t in (*state.keys, *state.values)) + 4 * 12 * 16 * 4


def test_corrupted_or_missing_indexer_keys_are_caught():
    model, adapter, spec = _tiny("deepseek_v32")
    ids = _ids(14)
    state = adapter.extract(copy.deepcopy(model), ids[:, :12])
    own = _own_logits(model, ids, 12)
    good = _next_logits(copy.deepcopy(model), adapter, state, ids[:, 12:])
    assert float((good - own).abs().max()) <= 1e-5
    # tokens' indexer keys in reverse order: the top-k selection changes, so the logits do
    flipped = replace(state, indexer_keys=tuple((i, t.flip(1)) for i, t in state.indexer_keys))
    bad = _next_logits(copy.deepcopy(model), adapter, flipped, ids[:, 12:])
    assert float((bad - own).abs().max()) > 1e-3
    with pytest.raises(StateError, match="no (sparse-attention )?indexer keys"):
        adapter.inject(replace(state, indexer_keys=()), model)
    short = replace(state, indexer_keys=tuple((i, t[..., :8]) for i, t in state.indexer_keys))
    with pytest.raises(StateError, match="indexer keys shape"):
        adapter.inject(short, model)


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa", "hy_v4"])
def test_repositioned_indexer_keys_equal_the_model_cache_at_the_new_positions(model_type):
    """RoPE of the indexer keys: the first (DeepSeek, GLM) or last (HY) rotary dims, half-split."""
    model, adapter, spec = _tiny(model_type)
    ids = _ids(12)
    moved = adapter.extract(copy.deepcopy(model), ids).reposition(7)
    ref = hf_cache.new_cache(model)
    with torch.no_grad():
        copy.deepcopy(model)(input_ids=ids, cache=ref, use_cache=True, position_ids=torch.arange(7, 19)[None])
    assert moved.indexer_keys, "no indexer keys carried"
    for i, t in moved.indexer_keys:
        assert float((t - ref.layers[i].indexer_keys).abs().max()) < 1e-5
    round_trip = moved.strip_rope().apply_rope()
    for (_, a), (_, b) in zip(round_trip.indexer_keys, moved.indexer_keys):
        assert float((a - b).abs().max()) < 1e-5


def test_shared_indexer_layers_cache_no_keys():
    model, adapter, spec = _tiny("hy_v4")  # indexer_types: full, full, shared, shared
    state = adapter.extract(copy.deepcopy(model), _ids(12))
    assert spec.indexer_layers == (0, 1) and [i for i, _ in state.indexer_keys] == [0, 1]
    assert dict(spec.indexer)["rope_offset"] == 8  # HY rotates the last qk_rope_head_dim dims


def test_slicing_keeps_indexer_keys_aligned_with_the_tokens():
    model, adapter, spec = _tiny("glm_moe_dsa")
    state = adapter.extract(copy.deepcopy(model), _ids(12))
    part = state.slice_tokens(0, 9)
    assert all(t.shape[1] == 9 for _, t in part.indexer_keys)
    part.validate(spec)


def test_concatenated_and_stacked_states_keep_their_indexer_keys():
    from kvbridge.evaluate.runner import cat_states
    from kvbridge.recompute.graft import concat_states

    model, adapter, spec = _tiny("glm_moe_dsa")
    state = adapter.extract(copy.deepcopy(model), _ids(12))
    joined = concat_states(state.slice_tokens(0, 5), state.slice_tokens(5, 12))  # tokens: graft's join
    assert [i for i, _ in joined.indexer_keys] == [i for i, _ in state.indexer_keys]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(joined.indexer_keys, state.indexer_keys))
    joined.validate(spec)
    other = adapter.extract(copy.deepcopy(model), _ids(12, seed=2))
    stacked = cat_states([state, other])  # batch: eval's stacked conditions
    for (_, s), (_, a), (_, b) in zip(stacked.indexer_keys, state.indexer_keys, other.indexer_keys):
        assert torch.equal(s, torch.cat([a, b]))
    stacked.validate(spec)


def test_indexer_keys_are_never_mapped_to_another_model():
    model, adapter, spec = _tiny("glm_moe_dsa")
    state = adapter.extract(copy.deepcopy(model), _ids(12))
    _, _, other = _tiny("deepseek_v32")
    plain = replace(other, indexer_layers=(), indexer=())  # an ordinary MLA target
    with pytest.raises(StateError, match="cannot be mapped across models"):
        state.strip_rope().apply_rope(spec=plain)
    with pytest.raises(StateError, match="does not cache"):
        state.validate(plain)


def test_raw_key_indexer_rebuilds_its_position_history(monkeypatch):
    """Qwen4-Exp's QSA indexer caches un-rotated keys and rotates them at run time from a position
    history on its first indexed layer: rebuilt from the state's positions, it must match."""
    model, adapter, spec = _tiny("qwen4_exp_text")
    info = dict(spec.indexer)
    assert spec.indexer_layers == (3,) and info["rope_dim"] == 0 and info["position_rows"] == 3
    ids = _ids(14)
    state = adapter.extract(copy.deepcopy(model), ids[:, :12])
    own = _own_logits(model, ids, 12)
    good = _next_logits(copy.deepcopy(model), adapter, state, ids[:, 12:])
    assert float((good - own).abs().max()) <= 1e-5
    rebuilt = hf_cache._indexer_positions
    monkeypatch.setattr(hf_cache, "_indexer_positions", lambda st: rebuilt(st).flip(-1))  # a wrong history
    bad = _next_logits(copy.deepcopy(model), adapter, state, ids[:, 12:])
    assert float((bad - own).abs().max()) > 1e-4


def test_minimax_lightning_state_is_carried_beside_the_layers():
    """MiniMax builds its own MiniMaxCache: K/V on attention layers, each lightning-attention
    layer's K^T V state in ``linear_cache``; both move whole, and a zeroed state is caught."""
    model, adapter, spec = _tiny("minimax")
    assert spec.state_layers == (1, 3) and spec.kv_layers == (0, 2)
    ids = _ids(14)
    state = adapter.extract(copy.deepcopy(model), ids[:, :12])
    assert [i for i, _ in state.states] == [1, 3] and all("linear_cache" in st for _, st in state.states)
    own = _own_logits(model, ids, 12)
    good = _next_logits(copy.deepcopy(model), adapter, state, ids[:, 12:])
    assert float((good - own).abs().max()) <= 1e-5
    zeroed = replace(state, states=tuple((i, {k: v * 0 for k, v in st.items()}) for i, st in state.states))
    bad = _next_logits(copy.deepcopy(model), adapter, zeroed, ids[:, 12:])
    assert float((bad - own).abs().max()) > 1e-4
