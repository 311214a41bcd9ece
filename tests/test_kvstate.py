"""KVState per-layer positional handling: NoPE layers, the MLA RoPE slot, recurrent state; the finite check."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kvbridge.spec import ModelSpec, RopeSpec
from kvbridge.errors import StateError
from kvbridge.kvstate import KVState


def _state(spec: ModelSpec, k_dim: int, v_dim: int, heads: int = 2, T: int = 5, **kw) -> KVState:
    g = torch.Generator().manual_seed(0)
    keys = tuple(torch.randn(1, heads, T, k_dim, generator=g) for _ in range(spec.num_layers))
    values = tuple(torch.randn(1, heads, T, v_dim, generator=g) for _ in range(spec.num_layers))
    return KVState(
        keys=keys, values=values, token_ids=torch.arange(T)[None], positions=torch.arange(T)[None], spec=spec, **kw
    )


def test_strip_and_apply_skip_exactly_the_nope_layers():
    rope = RopeSpec(head_dim=8)
    spec = ModelSpec("smollm3", 4, 4, 2, 8, 32, rope=rope, nope_layers=(1, 3))
    state = _state(spec, 8, 8)
    content = state.strip_rope()
    for i in (1, 3):
        assert torch.equal(content.keys[i], state.keys[i])
    for i in (0, 2):
        assert not torch.allclose(content.keys[i], state.keys[i])
    back = content.apply_rope()
    assert max(float((a - b).abs().max()) for a, b in zip(back.keys, state.keys)) < 1e-5
    moved = state.reposition(7)
    assert torch.equal(moved.keys[1], state.keys[1]) and not torch.allclose(moved.keys[0], state.keys[0])


def test_mla_rotates_the_shared_rope_key_in_the_value_slot():
    rope = RopeSpec(head_dim=4, interleaved=True)
    spec = ModelSpec("deepseek_v3", 2, 4, 1, 16, 32, rope=rope, value_head_dim=4, cache_format="mla")
    state = _state(spec, 16, 4, heads=1)
    content = state.strip_rope()
    assert all(torch.equal(a, b) for a, b in zip(content.keys, state.keys))  # the latent is position-free
    assert not torch.allclose(content.values[0], state.values[0])
    back = content.apply_rope()
    assert max(float((a - b).abs().max()) for a, b in zip(back.values, state.values)) < 1e-5


def test_layers_without_kv_and_recurrent_state():
    spec = ModelSpec(
        "qwen3_next",
        2,
        4,
        2,
        8,
        32,
        rope=RopeSpec(head_dim=8),
        no_kv_layers=(0,),
        state_layers=(0,),
        cache_format="hybrid",
    )
    state = _state(spec, 8, 8, states=((0, {"recurrent_states.0": torch.ones(1, 2, 3)}),))
    empty = torch.zeros(1, 0, 5, 0)
    state = KVState(
        keys=(empty, state.keys[1]),
        values=(empty, state.values[1]),
        token_ids=state.token_ids,
        positions=state.positions,
        spec=spec,
        states=state.states,
    )
    state.validate()
    assert torch.equal(state.strip_rope().keys[0], empty)
    clone = state.clone()
    assert clone.states[0][1]["recurrent_states.0"] is not state.states[0][1]["recurrent_states.0"]
    with pytest.raises(StateError, match="recurrent state"):
        state.slice_tokens(0, 4)
    assert state.slice_tokens(0, None).num_tokens == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_finite_check_finds_every_nan_and_inf(dtype):
    """The fast check (one 2-norm per tensor) never passes a NaN/inf, wherever it sits; a finite cache
    whose norm overflows is still found finite (the exact check decides then)."""
    from kvbridge.kvstate import all_finite

    gen = torch.Generator().manual_seed(0)
    for tokens in (1, 16, 300):
        base = [torch.randn(1, 3, tokens, 64, generator=gen).to(dtype) for _ in range(6)]
        assert all_finite(base)
        for bad in (float("nan"), float("inf"), -float("inf")):
            for layer in (0, 5):
                for at in (0, tokens * 64 // 2, 3 * tokens * 64 - 1):
                    ts = [t.clone() for t in base]
                    ts[layer].view(-1)[at] = bad
                    assert not all_finite(ts), (bad, layer, at)
                    assert not all_finite([t.transpose(1, 2) for t in ts])  # not contiguous
    big = torch.finfo(dtype).max / 2
    assert all_finite([torch.full((1, 2, 8, 4), big, dtype=dtype)])  # norm inf, elements finite
    assert all_finite([torch.zeros(1, 0, 4, 0, dtype=dtype), torch.ones(2, dtype=torch.long)])


def test_validate_names_the_non_finite_layer():
    from kvbridge.errors import StateError

    state = _state(ModelSpec("llama", 3, 4, 2, 8, 32, rope=RopeSpec(head_dim=8)), 8, 8)
    keys = list(state.keys)
    keys[-1] = keys[-1].clone()
    keys[-1][0, 0, -1, -1] = float("nan")
    with pytest.raises(StateError, match=f"layer {len(keys) - 1} keys has 1 NaN/inf values"):
        replace(state, keys=tuple(keys)).validate()
