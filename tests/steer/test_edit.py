"""Cache edits: a zero coefficient is bitwise the unsteered run, add-then-subtract restores the
cache within a stated bound, keys are rotated to the edited positions, bad arguments are one line."""

from __future__ import annotations

import pytest
import torch

from kvbridge.steer.edit import EditError, add_vector, mix_kv, scale_kv
from kvbridge.steer.sample import Setup, sample
from kvbridge.testing.steer_contract import steer_fixture


@pytest.fixture(scope="module")
def fx():
    return steer_fixture()


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip((*a.keys, *a.values), (*b.keys, *b.values)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_coefficient_is_bitwise_the_unsteered_run(fx, dtype):
    import copy

    from kvbridge.plugins import get_host

    model = copy.deepcopy(fx["model"]).to(dtype)
    state = get_host().adapter_for(model.config.to_dict()).extract(model, fx["state"].token_ids)
    steered = add_vector(state, fx["vector"], ck=0.0, cv=0.0, layers="all", start=0)
    assert steered.approximate and not state.approximate and _same(steered, state)
    base = sample(model, Setup(state, fx["live"]), [0, 1], 6, None, return_logits=True)
    got = sample(model, Setup(steered, fx["live"]), [0, 1], 6, None, return_logits=True)
    assert torch.equal(base["first_logits"], got["first_logits"]) and base["tokens"] == got["tokens"]


def test_add_then_subtract_restores_the_cache_within_the_rounding_bound(fx):
    state, vector = fx["state"], fx["vector"]
    c = 3.7
    up = add_vector(state, vector, ck=c, cv=c, start=0)
    back = add_vector(up, vector, ck=-c, cv=-c, start=0)
    eps = torch.finfo(torch.float32).eps
    from kvbridge.steer.edit import key_deltas

    kd = key_deltas(state, vector, 0, state.num_tokens, range(state.num_layers))
    for i in range(state.num_layers):
        for x, y, d in (
            (state.keys[i], back.keys[i], kd[i]),
            (state.values[i], back.values[i], vector.values[i][None, :, None]),
        ):
            step = (c * d).abs()
            bound = eps * (x.abs() + step)  # two correctly rounded float32 operations (IEEE, any CPU)
            assert bool(((y - x).abs() <= bound).all()), float(((y - x).abs() - bound).max())
    assert not _same(up, state)  # the edit did something
    assert len(back.meta["steered"]) == 2 and "steered" not in state.meta


def test_content_keys_are_rotated_to_each_edited_position(fx):
    """Adding d in content space then rotating == adding R(p) d to the cached keys."""
    state, vector = fx["state"], fx["vector"]
    start, stop = 3, 9
    steered = add_vector(state, vector, ck=1.0, cv=0.0, layers="all", start=start, stop=stop)
    content = state.strip_rope()
    keys = []
    for i, k in enumerate(content.keys):
        k = k.clone()
        k[:, :, start:stop] += vector.keys[i][None, :, None, :]
        keys.append(k)
    from dataclasses import replace

    expected = replace(content, keys=tuple(keys)).apply_rope()
    for a, b in zip(steered.keys, expected.keys):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(steered.keys, state.keys):  # outside the range nothing moved
        assert torch.equal(a[:, :, :start], b[:, :, :start]) and torch.equal(a[:, :, stop:], b[:, :, stop:])
    # the raw (rotated-space) vector would differ: the rotation matters at these positions
    rotated_space = replace(vector, key_space="rotated")
    raw = add_vector(state, rotated_space, ck=1.0, cv=0.0, start=start, stop=stop)
    assert not torch.allclose(raw.keys[0], steered.keys[0], atol=1e-3)


def test_scale_one_and_mix_zero_leave_the_cache_bitwise(fx):
    state, other = fx["state"], fx["other"]
    assert _same(scale_kv(state, ck=1.0, cv=1.0), state)
    assert _same(mix_kv(state, other, alpha=0.0), state)
    replaced = mix_kv(state, other, alpha=1.0, layers="1")
    assert torch.equal(replaced.values[1], other.values[1]) and torch.equal(replaced.values[0], state.values[0])
    assert replaced.approximate


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"ck": float("nan")}, "--ck must be finite"),
        ({"cv": float("inf")}, "--cv must be finite"),
        ({"cv": 1.0, "layers": "9"}, "out of range"),
        ({"cv": 1.0, "layers": [0, 4]}, "out of range"),
        ({"cv": 1.0, "start": 5, "stop": 99}, "outside the cache"),
    ],
)
def test_bad_arguments_are_one_line_errors(fx, kwargs, needle):
    with pytest.raises(EditError) as err:
        add_vector(fx["state"], fx["vector"], **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)
