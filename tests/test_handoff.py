"""Injection and the generate hand-off: validation, no aliasing, last-token withholding."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kvbridge.errors import StateError
from kvbridge.handoff import prepare_cache
from kvbridge.plugins import make_host

HOST = make_host(entry_points=False)


@pytest.fixture(scope="module")
def llama():
    adapter = HOST.adapter_for({"model_type": "llama"})
    model = adapter.build_model(adapter.tiny_config())
    ids = torch.randint(3, 100, (1, 10), generator=torch.Generator().manual_seed(0))
    return adapter, model, ids, adapter.extract(model, ids)


def test_inject_never_aliases_state_tensors(llama):
    adapter, model, ids, state = llama
    cache = adapter.inject(state, model)
    cache.layers[0].keys.add_(1.0)
    assert not torch.equal(cache.layers[0].keys, state.keys[0])


def test_handoff_withholds_last_prompt_token(llama):
    adapter, model, ids, state = llama
    cache, full = prepare_cache(model, state, ids, host=HOST)
    assert cache.get_seq_length() == ids.shape[1] - 1 and torch.equal(full, ids)


def test_handoff_refuses_a_state_that_is_not_a_prefix(llama):
    adapter, model, ids, state = llama
    other = ids.clone()
    other[0, 4] += 1
    with pytest.raises(StateError, match="first difference at token 4"):
        prepare_cache(model, state, other, host=HOST)


def test_inject_refuses_dtype_mismatch(llama):
    adapter, model, ids, state = llama
    with pytest.raises(StateError, match="dtype torch.bfloat16 != model dtype torch.float32"):
        adapter.inject(state.to(dtype=torch.bfloat16), model)


def test_inject_refuses_shape_mismatch(llama):
    adapter, model, ids, state = llama
    bad = replace(state, keys=tuple(k[:, :1] for k in state.keys))
    with pytest.raises(StateError, match="layer 0 keys shape"):
        adapter.inject(bad, model)
    with pytest.raises(StateError, match="layers"):
        adapter.inject(replace(state, keys=state.keys[:-1], values=state.values[:-1]), model)


def test_inject_refuses_non_finite_values(llama):
    adapter, model, ids, state = llama
    vals = list(state.values)
    vals[1] = vals[1].clone()
    vals[1][0, 0, 3, 0] = float("nan")
    with pytest.raises(StateError, match="layer 1 values has 1 NaN/inf"):
        adapter.inject(replace(state, values=tuple(vals)), model)


def test_inject_refuses_content_space_keys(llama):
    adapter, model, ids, state = llama
    with pytest.raises(StateError, match="content space"):
        adapter.inject(state.strip_rope(), model)


def test_stripped_keys_round_trip(llama):
    adapter, model, ids, state = llama
    back = state.strip_rope().apply_rope()
    err = max(float((a - b).abs().max()) for a, b in zip(back.keys, state.keys))
    assert err <= 1e-5
