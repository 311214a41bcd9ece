"""The exact RoPE codec (kvbridge.rope) against transformers 5.x.

1. tables: every rope type vs the transformers rotary module built from a LlamaConfig;
2. round trips strip(apply(x)) == x and apply(strip(k)) == k (hypothesis);
3. tiny real models: un-RoPE of cached keys == captured pre-RoPE keys, and back, per family
   (Llama x every rope type, GPT-J, Cohere, Phi, GPT-NeoX, Falcon, Phi3, Gemma3, Qwen3);
4. re-positioning 0..8 -> 100..108 == the model's own keys at 100..108;
5. unknown rope types give a one-line error; plugin variants resolve through the host.
"""

from __future__ import annotations

from kvbridge.builtin.rope_variants import BUILTIN_VARIANTS

import math
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Callable

import pytest
import torch

pytest.importorskip("transformers")
import transformers  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from transformers import DynamicCache  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from kvbridge import rope as R  # noqa: E402
from kvbridge import rope_kernels  # noqa: E402
from kvbridge.errors import KVBridgeError  # noqa: E402
from kvbridge.hookspecs import hookimpl  # noqa: E402
from kvbridge.plugins import make_host  # noqa: E402
from kvbridge.spec import FULL, SLIDING, ModelSpec, RopeSpec  # noqa: E402

HOST = make_host(entry_points=False)


def _spec(*args, **kwargs) -> RopeSpec:
    """A RopeSpec as the host builds one: carrying its variant (an unknown type stays unresolved)."""
    return RopeSpec.make(*args, **kwargs).with_variant(HOST.registry("rope_variant").items.get)


TOL_TABLE = 1e-6
TOL_KEYS = 1e-5
VOCAB = 128


def maxerr(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.double() - b.double()).abs().max())


@pytest.fixture(params=["eager", "native"])
def each_kernel(request):
    """The test under the eager kernels and under the native one (the default where it builds;
    without a compiler it falls back to eager, and the test still holds)."""
    rope_kernels.set_mode(request.param)
    yield request.param
    rope_kernels.set_mode(None)


FIXTURE_OK = [HealthCheck.function_scoped_fixture]  # the fixture only picks the kernel mode


def spec_from_params(
    params: dict, *, head_dim: int, max_pos: int, interleaved: bool = False, partial: float | None = None
) -> RopeSpec:
    """A RopeSpec from a transformers ``rope_parameters`` dict (written here, independent of the adapters)."""
    p = dict(params)
    rope_type = p.pop("rope_type", "default")
    theta = p.pop("rope_theta")
    pf = p.pop("partial_rotary_factor", 1.0)
    return _spec(
        rope_type,
        theta,
        head_dim=head_dim,
        partial_factor=pf if partial is None else partial,
        interleaved=interleaved,
        max_position_embeddings=max_pos,
        **p,
    )


# ---------------------------------------------------------------------------------------------
# Llama configs for every rope type
# ---------------------------------------------------------------------------------------------
HD = 32  # head dim of the table tests (16 frequencies: llama3/yarn ramps cover several)


def rope_cases(head_dim: int = HD) -> dict:
    half = head_dim // 2
    return {
        "default": ({"rope_type": "default", "rope_theta": 10000.0}, 64),
        "linear": ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, 64),
        "dynamic": ({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, 16),
        "yarn": (
            {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32},
            128,
        ),
        "longrope": (
            {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.05 * i for i in range(half)],
                "long_factor": [1.0 + 0.7 * i for i in range(half)],
                "original_max_position_embeddings": 16,
            },
            64,
        ),
        # llama 3.1 scaled down: factor 8, low 1, high 4, original context 256 (not 8192)
        "llama3": (
            {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
            2048,
        ),
    }


def llama_config(rope_type: str, head_dim: int = HD, **kw) -> transformers.LlamaConfig:
    params, max_pos = rope_cases(head_dim)[rope_type]
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters=dict(params),
    )
    base.update(kw)
    return transformers.LlamaConfig(**base)


def llama_spec(cfg) -> RopeSpec:
    return spec_from_params(cfg.rope_parameters, head_dim=cfg.head_dim, max_pos=cfg.max_position_embeddings)


# ---------------------------------------------------------------------------------------------
# 1. tables
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rope_type", list(rope_cases()))
@pytest.mark.parametrize("span", ["short", "long"])
def test_tables_match_transformers(rope_type, span):
    cfg = llama_config(rope_type)
    spec = llama_spec(cfg)
    torch.manual_seed(hash((rope_type, span)) % 2**31)
    high = cfg.max_position_embeddings // 2 if span == "short" else 40_000
    positions = torch.randint(0, high, (2, 64))
    positions[0, 0] = high - 1  # the forward length is known: high
    module = LlamaRotaryEmbedding(cfg)  # fresh: dynamic/longrope modules are sticky
    cos_hf, sin_hf = module(torch.zeros(1, dtype=torch.float32), positions)
    # transformers picks a stateful table from max(position_ids) + 1 over the whole batch
    lengths = torch.full_like(positions, int(positions.max()) + 1)
    cos, sin = R.tables(spec, positions, lengths=lengths)
    assert cos.shape == cos_hf.shape == (2, 64, spec.rotary_dim)
    assert maxerr(cos, cos_hf) <= TOL_TABLE
    assert maxerr(sin, sin_hf) <= TOL_TABLE
    # the frequencies are bit-identical (one ulp would cost ~1e-3 rad at position 40k)
    inv, scaling = R.inv_freq(spec, int(lengths.max()) if spec.is_stateful else None)
    assert torch.equal(inv, module.inv_freq)
    assert scaling == pytest.approx(module.attention_scaling, rel=1e-12)


def test_tables_attention_scaling_values():
    # the notes' values: yarn factor 4 ~1.14, longrope ~1.15 (factor 4 here: 64/16)
    yarn = llama_spec(llama_config("yarn"))
    assert R.inv_freq(yarn)[1] == pytest.approx(0.1 * math.log(4) + 1)
    long = llama_spec(llama_config("longrope"))
    assert R.inv_freq(long)[1] == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))
    for t in ("default", "linear", "dynamic", "llama3"):
        assert R.inv_freq(llama_spec(llama_config(t)))[1] == 1.0


def test_tables_layouts_and_dtype():
    spec = _spec(head_dim=16)
    pos = torch.arange(5)[None]
    cos, sin = R.tables(spec, pos)
    assert torch.equal(cos[..., :8], cos[..., 8:])  # half split: frequencies concatenated twice
    ci, si = R.tables(replace(spec, interleaved=True), pos)
    assert torch.equal(ci[..., 0::2], ci[..., 1::2])  # interleaved: each frequency twice, adjacent
    assert torch.equal(ci[..., 0::2], cos[..., :8]) and torch.equal(si[..., 1::2], sin[..., 8:])
    cb, _ = R.tables(spec, pos, dtype=torch.bfloat16)
    assert cb.dtype == torch.bfloat16 and torch.equal(cb, cos.to(torch.bfloat16))
    cp, _ = R.tables(replace(spec, partial_factor=0.25), pos)
    assert cp.shape == (1, 5, 4)


def test_dynamic_table_changes_only_past_max_positions():
    spec = llama_spec(llama_config("dynamic"))  # max positions 16
    static, _ = R.inv_freq(spec)
    assert torch.equal(R.inv_freq(spec, 16)[0], static)
    assert torch.equal(R.inv_freq(spec, 3)[0], static)
    assert not torch.equal(R.inv_freq(spec, 17)[0], static)
    assert torch.equal(static, R.inv_freq(replace(spec, rope_type="default", scaling=()), host=HOST)[0])
    long = llama_spec(llama_config("longrope"))  # original 16
    assert torch.equal(R.inv_freq(long, 16)[0], R.inv_freq(long)[0])
    assert not torch.equal(R.inv_freq(long, 17)[0], R.inv_freq(long)[0])
    assert torch.equal(R.inv_freq(long, 17)[0], R.inv_freq(long, 4000)[0])


def test_forward_lengths():
    pos = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 9]])
    # one forward: transformers takes max(position_ids) + 1 over the whole batch
    assert R.forward_lengths(pos).tolist() == [[10, 10, 10, 10], [10, 10, 10, 10]]
    assert R.forward_lengths(torch.arange(3)).tolist() == [3, 3, 3]


# ---------------------------------------------------------------------------------------------
# 2. round trips (hypothesis)
# ---------------------------------------------------------------------------------------------
def random_spec(rope_type: str, head_dim: int, partial: float, interleaved: bool) -> RopeSpec:
    rotary = int(head_dim * partial) // 2 * 2
    half = max(rotary // 2, 1)
    params = {
        "default": {},
        "linear": {"factor": 4.0},
        "dynamic": {"factor": 2.0},
        "yarn": {"factor": 8.0, "original_max_position_embeddings": 512},
        "longrope": {
            "short_factor": [1.0 + 0.1 * i for i in range(half)],
            "long_factor": [2.0 + 1.5 * i for i in range(half)],
            "original_max_position_embeddings": 1024,
        },
        "llama3": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
    }[rope_type]
    return _spec(
        rope_type,
        10000.0 if rope_type != "llama3" else 500000.0,
        head_dim=head_dim,
        partial_factor=partial,
        interleaved=interleaved,
        max_position_embeddings=4096,
        **params,
    )


ROPE_TYPES = list(rope_cases())
spec_strategy = st.builds(
    random_spec,
    rope_type=st.sampled_from(ROPE_TYPES),
    head_dim=st.integers(4, 64).map(lambda n: 2 * n),
    partial=st.sampled_from([0.25, 0.4, 0.5, 1.0]),
    interleaved=st.booleans(),
)


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    spec=spec_strategy,
    batch=st.integers(1, 2),
    tokens=st.integers(1, 12),
    max_position=st.sampled_from([16, 3000, 40_000]),
    seed=st.integers(0, 2**31 - 1),
    with_lengths=st.booleans(),
)
def test_round_trip(each_kernel, spec, batch, tokens, max_position, seed, with_lengths):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 2, tokens, spec.head_dim, generator=g)
    pos = torch.randint(0, max_position, (batch, tokens), generator=g)
    lengths = None
    if with_lengths:  # keys of many forwards (decode past the limits of dynamic/longrope)
        lengths = pos + 1 + torch.randint(0, 3000, (batch, tokens), generator=g)
    k = R.apply(x, pos, spec, lengths=lengths)
    assert k.dtype == x.dtype and k.shape == x.shape
    r = spec.rotary_dim
    assert torch.equal(k[..., r:], x[..., r:])  # partial rotary: the rest passes unchanged
    assert maxerr(R.strip(k, pos, spec, lengths=lengths), x) <= TOL_KEYS
    assert maxerr(R.apply(R.strip(x, pos, spec, lengths=lengths), pos, spec, lengths=lengths), x) <= TOL_KEYS
    # the fused re-position stays within 1e-6 of strip + apply
    new_pos = torch.randint(0, max_position, (batch, tokens), generator=g)
    fused = R.reposition(k, pos, new_pos, spec, old_lengths=lengths, new_lengths=lengths)
    two_step = R.apply(R.strip(k, pos, spec, lengths=lengths), new_pos, spec, lengths=lengths)
    assert maxerr(fused, two_step) <= 1e-6


@settings(max_examples=30, deadline=None, suppress_health_check=FIXTURE_OK)
@given(spec=spec_strategy, seed=st.integers(0, 2**31 - 1))
def test_apply_matches_reference_formula(each_kernel, spec, seed):
    """apply == x*cos + rotate(x)*sin with the tables (the models' formula), bit for bit."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 7, spec.head_dim, generator=g)
    pos = torch.randint(0, 40_000, (2, 7), generator=g)
    cos, sin = R.tables(spec, pos)
    cos, sin = cos[:, None], sin[:, None]
    r = spec.rotary_dim
    xr = x[..., :r]
    if spec.interleaved:
        rot = torch.stack((-xr[..., 1::2], xr[..., 0::2]), dim=-1).flatten(-2)
    else:
        rot = torch.cat((-xr[..., r // 2 :], xr[..., : r // 2]), dim=-1)
    want = torch.cat((xr * cos + rot * sin, x[..., r:]), dim=-1)
    assert torch.equal(R.apply(x, pos, spec), want)  # bit for bit, as the models compute it


def test_round_trip_bfloat16_and_float64(each_kernel):
    spec = _spec("yarn", head_dim=64, factor=4.0, original_max_position_embeddings=256, max_position_embeddings=1024)
    x = torch.randn(2, 2, 16, 64)
    pos = torch.randint(0, 5000, (2, 16))
    for dtype, tol in ((torch.bfloat16, 0.05), (torch.float16, 0.01), (torch.float64, 1e-12)):
        xd = x.to(dtype)
        k = R.apply(xd, pos, spec)
        assert k.dtype == dtype
        back = R.strip(k, pos, spec)
        assert back.dtype == dtype
        assert maxerr(back, xd) <= tol * max(1.0, float(x.abs().max()))
        assert R.reposition(k, pos, pos + 7, spec).dtype == dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_reposition_is_one_rounding(each_kernel, dtype):
    """Half-precision reposition is one rotation by the composite table, rounded once: within a
    rounding of the exact move, and no farther from it than strip + apply."""
    spec = _spec("default", 1e6, head_dim=64, max_position_embeddings=32768)
    g = torch.Generator().manual_seed(5)
    k = R.apply(torch.randn(2, 2, 24, 64, generator=g).to(dtype), torch.arange(24)[None], spec)
    old, new = torch.arange(24)[None], torch.arange(24)[None] + 3000
    exact = R.reposition(k.double(), old, new, spec)  # the move itself, in float64
    moved = R.reposition(k, old, new, spec)
    two_step = R.apply(R.strip(k, old, spec), new, spec)
    assert moved.dtype == dtype
    err, err2 = maxerr(moved.double(), exact), maxerr(two_step.double(), exact)
    assert err <= torch.finfo(dtype).eps * float(exact.abs().max())
    assert err <= err2


def test_table_cache_sees_in_place_changes():
    spec = _spec(head_dim=16)
    x = torch.randn(1, 2, 4, 16)
    pos = torch.arange(4)[None].clone()
    a = R.apply(x, pos, spec)
    assert torch.equal(R.apply(x, pos, spec), a)  # cached
    pos.add_(10)  # version counter moves: a fresh table
    assert torch.equal(R.apply(x, pos, spec), R.apply(x, torch.arange(10, 14)[None], spec))
    with torch.inference_mode():  # inference tensors (no version counter) are keyed by content
        ipos = torch.arange(4)[None]
        assert torch.equal(R.apply(x, ipos, spec), a)


def test_a_dead_positions_tensor_frees_its_tables():
    import gc

    R.clear_caches()
    spec = _spec(head_dim=16)
    x = torch.randn(1, 2, 4, 16)
    keep = torch.arange(4)[None].clone()
    moved = keep + 7
    R.reposition(R.apply(x, keep, spec), keep, moved, spec)  # tables of keep and moved, one fused kernel
    assert len(R._TABLES.items) == 2 and len(R._FUSED.items) == 1
    del moved  # its table goes, and the fused kernel that read it
    gc.collect()
    assert len(R._TABLES.items) == 1 and len(R._FUSED.items) == 0
    for start in range(5):  # one batch's positions after another, each dropped once used
        pos = torch.arange(start, start + 4)[None].clone()
        R.strip(x, pos, spec)
        del pos
    gc.collect()
    assert len(R._TABLES.items) == 1  # keep's: not the five finished batches' (LRU room for 32)
    assert torch.equal(R.apply(x, keep, spec), R.apply(x, torch.arange(4)[None], spec))


def test_positions_given_as_lists_are_accepted_and_cached_by_value():
    spec = _spec(head_dim=16)
    x = torch.randn(1, 2, 3, 16)
    want = R.apply(x, torch.arange(3)[None], spec)
    assert torch.equal(R.apply(x, [[0, 1, 2]], spec), want)
    cos, sin = R.tables(spec, [[0, 1, 2]])
    ref_cos, ref_sin = R.tables(spec, torch.arange(3)[None])
    assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)
    assert torch.equal(R.strip(want, [[0, 1, 2]], spec), R.strip(want, torch.arange(3)[None], spec))


def test_non_contiguous_keys_and_broadcast_positions(each_kernel):
    spec = _spec(head_dim=16, interleaved=True)
    x = torch.randn(2, 6, 3, 16).transpose(1, 2)  # [2, 3, 6, 16], not contiguous
    pos = torch.arange(6)[None]  # one row for the whole batch
    k = R.apply(x, pos, spec)
    assert maxerr(k, R.apply(x.contiguous(), pos.expand(2, -1), spec)) == 0.0
    assert maxerr(R.strip(k, pos, spec), x) <= 1e-6


def test_bad_shapes_are_clear_errors():
    spec = _spec(head_dim=16)
    with pytest.raises(KVBridgeError, match="positions shape"):
        R.apply(torch.randn(1, 2, 4, 16), torch.arange(5)[None], spec)
    with pytest.raises(KVBridgeError, match="head_dim"):
        R.apply(torch.randn(1, 2, 4, 8), torch.arange(4)[None], spec)
    with pytest.raises(KVBridgeError, match="head_dim"):
        R.strip(torch.randn(1, 2, 4, 32), torch.arange(4)[None], spec)
    with pytest.raises(KVBridgeError, match="short_factor"):
        R.apply(
            torch.randn(1, 2, 4, 16),
            torch.arange(4)[None],
            _spec("longrope", head_dim=16, short_factor=[1.0], long_factor=[1.0]),
        )
    with pytest.raises(KVBridgeError, match="'factor'"):
        R.apply(torch.randn(1, 2, 4, 16), torch.arange(4)[None], _spec("linear", head_dim=16))


# ---------------------------------------------------------------------------------------------
# 3. tiny real models: captured pre-RoPE keys
# ---------------------------------------------------------------------------------------------
def heads_from_flat(out, heads, head_dim):
    """[B, T, H*D] -> [B, H, T, D]"""
    b, t, _ = out.shape
    return out.reshape(b, t, heads, head_dim).transpose(1, 2)


@dataclass
class Family:
    """How to build a tiny model and read its pre-RoPE keys (per layer) and RoPE tables."""

    name: str
    make: Callable[[], object]  # -> config
    model_class: str
    hook: Callable[[object, object], tuple]  # (model, config) -> [(module, out -> [B,H,T,D]) per layer]
    ropes: Callable[[object], list]  # config -> RopeSpec per layer
    dtype: torch.dtype = torch.float32


def _llama_like_hook(model, cfg):
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return [
        (layer.self_attn.k_proj, lambda o: heads_from_flat(o, cfg.num_key_value_heads, hd))
        for layer in model.model.layers
    ]


def _gemma3_hook(model, cfg):  # k_norm runs on [B, H, T, D] in Gemma3
    return [(layer.self_attn.k_norm, lambda o: o) for layer in model.model.layers]


def _qwen3_hook(model, cfg):  # k_norm runs on [B, T, H, D]
    return [(layer.self_attn.k_norm, lambda o: o.transpose(1, 2)) for layer in model.model.layers]


def _cohere_hook(model, cfg):
    hd = cfg.hidden_size // cfg.num_attention_heads
    kv = cfg.num_key_value_heads
    if cfg.use_qk_norm:
        return [(layer.self_attn.k_norm, lambda o: o.transpose(1, 2)) for layer in model.model.layers]
    return [(layer.self_attn.k_proj, lambda o: heads_from_flat(o, kv, hd)) for layer in model.model.layers]


def _gptj_hook(model, cfg):
    hd = cfg.n_embd // cfg.n_head
    return [(blk.attn.k_proj, lambda o: heads_from_flat(o, cfg.n_head, hd)) for blk in model.transformer.h]


def _phi_hook(model, cfg):
    hd = cfg.hidden_size // cfg.num_attention_heads
    kv = cfg.num_key_value_heads
    if cfg.qk_layernorm:  # layernorm on [B, H, T, D]
        return [(layer.self_attn.k_layernorm, lambda o: o) for layer in model.model.layers]
    return [(layer.self_attn.k_proj, lambda o: heads_from_flat(o, kv, hd)) for layer in model.model.layers]


def _neox_hook(model, cfg):
    hd = cfg.hidden_size // cfg.num_attention_heads
    h = cfg.num_attention_heads

    def key(o):  # fused [B, T, H*3*D] -> [B, H, T, 3D] -> the middle third
        b, t, _ = o.shape
        return o.view(b, t, h, 3 * hd).transpose(1, 2)[..., hd : 2 * hd]

    return [(layer.attention.query_key_value, key) for layer in model.gpt_neox.layers]


def _falcon_hook(model, cfg):  # multi-query: [B, T, (H+2)*D], key = head H
    hd = cfg.hidden_size // cfg.num_attention_heads
    h = cfg.num_attention_heads

    def key(o):
        b, t, _ = o.shape
        return o.view(b, t, h + 2, hd)[:, :, h : h + 1].transpose(1, 2)

    return [(layer.self_attention.query_key_value, key) for layer in model.transformer.h]


def _phi3_hook(model, cfg):  # fused qkv_proj: [q | k | v]
    hd = cfg.hidden_size // cfg.num_attention_heads
    q = cfg.num_attention_heads * hd
    kv = cfg.num_key_value_heads
    return [
        (layer.self_attn.qkv_proj, lambda o: heads_from_flat(o[..., q : q + kv * hd], kv, hd))
        for layer in model.model.layers
    ]


def _olmo2_hook(model, cfg):  # k_norm runs over the whole projection [B, T, H*D]
    hd = cfg.hidden_size // cfg.num_attention_heads
    return [
        (layer.self_attn.k_norm, lambda o: heads_from_flat(o, cfg.num_key_value_heads, hd))
        for layer in model.model.layers
    ]


def _same(spec_fn):
    return lambda cfg: [spec_fn(cfg)] * 2


SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def _gptj_cfg():
    return transformers.GPTJConfig(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=256, n_inner=64
    )


def _gptj_rope(cfg):
    hd = cfg.n_embd // cfg.n_head
    return _spec(
        "default",
        10000.0,
        head_dim=hd,
        partial_factor=cfg.rotary_dim / hd,
        interleaved=True,
        max_position_embeddings=cfg.n_positions,
    )


def _hf_rope(interleaved=False):
    def fn(cfg):
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return spec_from_params(
            cfg.rope_parameters, head_dim=hd, max_pos=cfg.max_position_embeddings, interleaved=interleaved
        )

    return fn


def _gemma3_cfg():
    return transformers.Gemma3TextConfig(
        **SMALL,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=32,
        layer_types=[SLIDING, FULL],
        max_position_embeddings=512,
        rope_parameters={
            SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
            FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        },
    )


def _gemma3_ropes(cfg):
    return [
        spec_from_params(cfg.rope_parameters[t], head_dim=cfg.head_dim, max_pos=cfg.max_position_embeddings)
        for t in cfg.layer_types
    ]


def _phi3_cfg():
    half = 8
    return transformers.Phi3Config(
        **SMALL,
        num_key_value_heads=2,
        max_position_embeddings=64,
        original_max_position_embeddings=16,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.1 * i for i in range(half)],
            "long_factor": [1.0 + 0.9 * i for i in range(half)],
        },
        pad_token_id=0,
    )


FAMILIES = {
    **{
        f"llama-{t}": Family(
            f"llama-{t}",
            (lambda t=t: llama_config(t, head_dim=16)),
            "LlamaForCausalLM",
            _llama_like_hook,
            _same(llama_spec),
        )
        for t in rope_cases()
    },
    "gptj": Family("gptj", _gptj_cfg, "GPTJForCausalLM", _gptj_hook, _same(_gptj_rope)),
    "cohere": Family(
        "cohere",
        lambda: transformers.CohereConfig(**SMALL, num_key_value_heads=2),
        "CohereForCausalLM",
        _cohere_hook,
        _same(_hf_rope(interleaved=True)),
    ),
    "cohere-qknorm": Family(
        "cohere-qknorm",
        lambda: transformers.CohereConfig(**SMALL, num_key_value_heads=2, use_qk_norm=True),
        "CohereForCausalLM",
        _cohere_hook,
        _same(_hf_rope(interleaved=True)),
    ),
    "phi-0.5": Family(
        "phi-0.5",
        lambda: transformers.PhiConfig(**SMALL, partial_rotary_factor=0.5),
        "PhiForCausalLM",
        _phi_hook,
        _same(_hf_rope()),
    ),
    "phi-0.4-qkln": Family(
        "phi-0.4-qkln",
        lambda: transformers.PhiConfig(**SMALL, partial_rotary_factor=0.4, qk_layernorm=True),
        "PhiForCausalLM",
        _phi_hook,
        _same(_hf_rope()),
    ),
    "gpt_neox": Family(
        "gpt_neox",
        lambda: transformers.GPTNeoXConfig(**SMALL, rotary_pct=0.25),
        "GPTNeoXForCausalLM",
        _neox_hook,
        _same(_hf_rope()),
    ),
    "falcon": Family(
        "falcon",
        lambda: transformers.FalconConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            alibi=False,
            multi_query=True,
            new_decoder_architecture=False,
        ),
        "FalconForCausalLM",
        _falcon_hook,
        _same(_hf_rope()),
    ),
    "phi3-longrope": Family("phi3-longrope", _phi3_cfg, "Phi3ForCausalLM", _phi3_hook, _same(_hf_rope())),
    "gemma3": Family("gemma3", _gemma3_cfg, "Gemma3ForCausalLM", _gemma3_hook, _gemma3_ropes),
    "qwen3": Family(
        "qwen3",
        lambda: transformers.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=16),
        "Qwen3ForCausalLM",
        _qwen3_hook,
        _same(_hf_rope()),
    ),
    "mistral": Family(
        "mistral",
        lambda: transformers.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=6),
        "MistralForCausalLM",
        _llama_like_hook,
        _same(_hf_rope()),
    ),
    "qwen2": Family(
        "qwen2",
        lambda: transformers.Qwen2Config(**SMALL, num_key_value_heads=2),
        "Qwen2ForCausalLM",
        _llama_like_hook,
        _same(_hf_rope()),
    ),
    "gemma": Family(
        "gemma",
        lambda: transformers.GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=16),
        "GemmaForCausalLM",
        _llama_like_hook,
        _same(_hf_rope()),
    ),
    "gemma2": Family(
        "gemma2",
        lambda: transformers.Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=16, sliding_window=6),
        "Gemma2ForCausalLM",
        _llama_like_hook,
        _same(_hf_rope()),
    ),
    "stablelm": Family(
        "stablelm",
        lambda: transformers.StableLmConfig(**SMALL, num_key_value_heads=2, partial_rotary_factor=0.25),
        "StableLmForCausalLM",
        _llama_like_hook,
        _same(_hf_rope()),
    ),
    "olmo2": Family(
        "olmo2",
        lambda: transformers.Olmo2Config(**SMALL, num_key_value_heads=2),
        "Olmo2ForCausalLM",
        _olmo2_hook,
        _same(_hf_rope()),
    ),
}


def build(family: Family, seed: int = 0):
    torch.manual_seed(seed)
    cfg = family.make()
    cls = getattr(transformers, family.model_class)
    if family.dtype == torch.float32:
        return cls(cfg).eval(), cfg
    # as from_pretrained(dtype=...) does: weights in the dtype, inv_freq buffers kept in float32
    # (model.to(bfloat16) would round inv_freq itself to bf16: a different table)
    model = cls._from_config(cfg, dtype=family.dtype).eval()
    for name, buf in model.named_buffers():
        if name.endswith("inv_freq"):
            assert buf.dtype == torch.float32, (name, buf.dtype)
    return model, cfg


def run_captured(model, cfg, family: Family, ids: torch.Tensor, *, position_ids=None, decode: int = 0):
    """Prefill ``ids[:, :T-decode]`` then decode the rest one token at a time.

    Returns (cache, pre-RoPE keys per layer [B, H, T, D], forward length of each key [B, T]).
    """
    captured: dict[int, list] = {}
    handles = []
    for i, (module, to_heads) in enumerate(family.hook(model, cfg)):
        handles.append(
            module.register_forward_hook(
                lambda mod, inp, out, i=i, f=to_heads: captured.setdefault(i, []).append(f(out).detach().clone())
            )
        )
    cache = DynamicCache()
    b, t = ids.shape
    steps = [(0, t - decode)] + [(s, s + 1) for s in range(t - decode, t)]
    lengths = []
    try:
        with torch.no_grad():
            for start, stop in steps:
                kwargs = {}
                if position_ids is not None:
                    kwargs["position_ids"] = position_ids[:, start:stop]
                model(ids[:, start:stop], cache=cache, use_cache=True, **kwargs)
                stop_pos = int(position_ids[:, start:stop].max()) + 1 if position_ids is not None else stop
                lengths.append(torch.full((b, stop - start), stop_pos))
    finally:
        for h in handles:
            h.remove()
    pre = [torch.cat(captured[i], dim=2) for i in sorted(captured)]
    return cache, pre, torch.cat(lengths, dim=1)


_ADAPTER_HOST = None


def adapter_rope_check(cfg, ropes: list) -> str:
    """When a family adapter exists for this config, its spec's RoPE must equal ours."""
    global _ADAPTER_HOST
    from kvbridge.errors import UnsupportedModelError
    from kvbridge.plugins import make_host

    if _ADAPTER_HOST is None:
        _ADAPTER_HOST = make_host(entry_points=False)
    try:
        spec = _ADAPTER_HOST.describe(cfg.to_dict())
    except UnsupportedModelError:
        return "no adapter"
    for i, want in enumerate(ropes):
        assert spec.rope_for_layer(i) == want, f"layer {i}: adapter {spec.rope_for_layer(i)} != {want}"
    return "checked"


def family_errors(name: str, tokens: int = 11, decode: int = 0, seed: int = 0) -> dict:
    family = FAMILIES[name]
    model, cfg = build(family, seed)
    ropes = family.ropes(cfg)
    ids = torch.randint(0, VOCAB, (2, tokens), generator=torch.Generator().manual_seed(seed))
    cache, pre, lengths = run_captured(model, cfg, family, ids, decode=decode)
    pos = torch.arange(tokens)[None].expand(2, -1)
    out = {"strip": 0.0, "apply": 0.0, "adapter": adapter_rope_check(cfg, ropes)}
    for i, spec in enumerate(ropes):
        keys = cache.layers[i].keys
        assert keys.shape == pre[i].shape, (name, i, keys.shape, pre[i].shape)
        lens = lengths if spec.is_stateful else None
        out["strip"] = max(out["strip"], maxerr(R.strip(keys, pos, spec, lengths=lens), pre[i]))
        out["apply"] = max(out["apply"], maxerr(R.apply(pre[i], pos, spec, lengths=lens), keys))
    return out


@pytest.mark.parametrize("name", list(FAMILIES))
def test_model_keys_strip_and_apply(name):
    errs = family_errors(name)
    assert errs["strip"] <= TOL_KEYS, errs
    assert errs["apply"] <= TOL_KEYS, errs
    assert errs["apply"] == 0.0, errs  # bit-identical to the model's own RoPE (CPU, float32)


@pytest.mark.parametrize("name", ["llama-dynamic", "llama-longrope", "phi3-longrope"])
def test_model_keys_stateful_prefill_past_the_limit(name):
    # a 24-token prefill: past max_position_embeddings (dynamic, 16) / the original context (longrope, 16)
    errs = family_errors(name, tokens=24)
    assert errs["strip"] <= TOL_KEYS and errs["apply"] <= TOL_KEYS, errs


@pytest.mark.parametrize("name", ["llama-dynamic", "llama-longrope", "phi3-longrope"])
def test_model_keys_stateful_decode_across_the_limit(name):
    """Prefill 12, decode 12 one at a time across the limit: each key used its own forward length."""
    family = FAMILIES[name]
    model, cfg = build(family)
    spec = family.ropes(cfg)[0]
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(1))
    cache, pre, lengths = run_captured(model, cfg, family, ids, decode=12)
    assert lengths[0, :12].tolist() == [12] * 12 and lengths[0, 12:].tolist() == list(range(13, 25))
    pos = torch.arange(24)[None]
    for i in range(cfg.num_hidden_layers):
        keys = cache.layers[i].keys
        assert maxerr(R.strip(keys, pos, spec, lengths=lengths), pre[i]) <= TOL_KEYS
        assert maxerr(R.apply(pre[i], pos, spec, lengths=lengths), keys) <= TOL_KEYS
    # one prefill's table (lengths=None) is *not* what these keys used
    assert maxerr(R.strip(cache.layers[0].keys, pos, spec), pre[0]) > 1e-3


def test_model_keys_bfloat16_apply_is_bit_exact(each_kernel):
    """In bf16 the models rotate with tables cast to bf16, in bf16 arithmetic: apply does the same."""
    family = replace(FAMILIES["llama-yarn"], dtype=torch.bfloat16)
    model, cfg = build(family)
    spec = family.ropes(cfg)[0]
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    cache, pre, _ = run_captured(model, cfg, family, ids)
    pos = torch.arange(9)[None]
    for i in range(2):
        keys = cache.layers[i].keys
        assert keys.dtype == torch.bfloat16
        assert torch.equal(R.apply(pre[i], pos, spec), keys)
        scale = float(pre[i].float().abs().max())
        assert maxerr(R.strip(keys, pos, spec), pre[i]) <= 2**-7 * scale  # bf16 precision


# ---------------------------------------------------------------------------------------------
# 4. re-positioning
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["llama-default", "llama-yarn", "llama-llama3", "gptj", "gemma3", "qwen3", "gpt_neox", "cohere"]
)
def test_reposition_matches_model_at_new_positions(each_kernel, name):
    family = FAMILIES[name]
    model, cfg = build(family)
    ropes = family.ropes(cfg)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    old = torch.arange(9)[None].expand(2, -1)
    new = old + 100
    cache0, _, _ = run_captured(model, cfg, family, ids, position_ids=old)
    cache1, _, _ = run_captured(model, cfg, family, ids, position_ids=new)
    for i, spec in enumerate(ropes):
        k0, k1 = cache0.layers[i].keys, cache1.layers[i].keys
        assert maxerr(R.reposition(k0, old, new, spec), k1) <= TOL_KEYS
        assert maxerr(R.apply(R.strip(k0, old, spec), new, spec), k1) <= TOL_KEYS


def test_kvstate_round_trip_through_codec():
    from kvbridge.kvstate import KVState

    spec_rope = _spec(
        "longrope",
        head_dim=16,
        max_position_embeddings=64,
        original_max_position_embeddings=16,
        short_factor=[1.0] * 8,
        long_factor=[float(i + 1) for i in range(8)],
    )
    ms = ModelSpec(
        model_type="llama",
        num_layers=2,
        num_attention_heads=4,
        num_kv_heads=2,
        head_dim=16,
        hidden_size=64,
        rope=spec_rope,
    )
    keys = tuple(torch.randn(1, 2, 20, 16) for _ in range(2))
    state = KVState(
        keys=keys,
        values=keys,
        token_ids=torch.zeros(1, 20, dtype=torch.long),
        positions=torch.arange(20)[None],
        spec=ms,
        rope_applied=False,
    )
    rotated = state.apply_rope()
    assert rotated.rope_lengths.tolist() == [[20] * 20]
    back = rotated.strip_rope()
    for a, b in zip(back.keys, keys):
        assert maxerr(a, b) <= TOL_KEYS
    moved = rotated.reposition(5)
    assert torch.equal(moved.positions, state.positions + 5)


# ---------------------------------------------------------------------------------------------
# 5. errors and plugins
# ---------------------------------------------------------------------------------------------
def test_unknown_rope_type_is_a_one_line_error():
    spec = _spec("no-such-rope", head_dim=16)
    with pytest.raises(KVBridgeError) as info:
        R.apply(torch.randn(1, 1, 2, 16), torch.arange(2)[None], spec, host=HOST)
    msg = str(info.value)
    assert isinstance(info.value, R.UnknownRopeTypeError)
    assert "no-such-rope" in msg and "default" in msg and "longrope" in msg and "\n" not in msg
    with pytest.raises(R.UnknownRopeTypeError):
        R.tables(spec, torch.arange(2)[None])


class _HalfThetaPlugin:
    """A plugin RoPE type: default RoPE at half the base."""

    @hookimpl
    def kvbridge_register_rope_variants(self, register):
        def inv_freq(rope, seq_len, device):
            return BUILTIN_VARIANTS["default"].inv_freq(replace(rope, theta=rope.theta / 2), seq_len, device)

        register(R.RopeVariant("half_theta", inv_freq, "test variant"))


def test_plugin_variant_through_host():
    from kvbridge.plugins import make_host

    host = make_host(entry_points=False, extra=[("half-theta", _HalfThetaPlugin())])
    assert "half_theta" in host.registry("rope_variant").names()
    spec = _spec("half_theta", 20000.0, head_dim=16)
    x = torch.randn(1, 2, 5, 16)
    pos = torch.arange(5)[None]
    want = R.apply(x, pos, _spec("default", 10000.0, head_dim=16))
    assert torch.equal(R.apply(x, pos, spec, host=host), want)
    assert maxerr(R.strip(want, pos, spec, host=host), x) <= 1e-6
    with pytest.raises(R.UnknownRopeTypeError, match="half_theta"):  # not in the default host
        R.apply(x, pos, spec)
    # the two-argument form of the hook docs, inv_freq(rope, seq_len), works too
    two_arg = R.RopeVariant(
        "half_theta",
        lambda rope, seq_len: BUILTIN_VARIANTS["default"].inv_freq(replace(rope, theta=rope.theta / 2), seq_len, None),
    )

    class _Host:
        def get(self, kind, name):
            return two_arg

    assert torch.equal(R.apply(x, pos, spec, host=_Host()), want)
    # the built-ins resolve through the host too, to the same objects
    for name, variant in BUILTIN_VARIANTS.items():
        assert host.get("rope_variant", name) is variant


def test_builtin_plugin_registers_without_torch():
    code = (
        "import sys; from kvbridge.plugins import make_host; "
        "names = make_host(entry_points=False).registry('rope_variant').names(); "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert set(names) >= {'default', 'linear', 'dynamic', 'yarn', 'longrope', 'llama3'}, names; "
        "print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def test_the_spec_carries_its_variant_and_the_codec_looks_nothing_up():
    cfg = llama_config("dynamic")
    spec = HOST.describe(cfg.to_dict())
    assert spec.rope.variant is HOST.get("rope_variant", "dynamic")  # resolved when the spec was built

    class _NoLookups:
        def get(self, kind, name):
            raise AssertionError("the codec looked the variant up")

    x, pos = torch.randn(1, 2, 5, spec.rope.head_dim), torch.arange(5)[None]
    assert torch.equal(R.apply(x, pos, spec.rope, host=_NoLookups()), R.apply(x, pos, spec.rope, host=HOST))
    assert spec == ModelSpec.from_dict(spec.to_dict())  # the variant is not part of equality or the manifest
    moved = replace(spec.rope, rope_type="default", scaling=())
    assert moved.variant is None and HOST.resolved(moved).variant is HOST.get("rope_variant", "default")
    with pytest.raises(R.UnknownRopeTypeError, match="has no variant"):
        R.apply(x, pos, RopeSpec.make(head_dim=spec.rope.head_dim))  # built without the host, no host given
