"""Every tiny config against the model transformers builds from it (CPU, float32, random weights).

- the cache geometry: ``cache.layers[i].keys.shape == [B, spec.num_kv_heads, T, spec.head_dim]``;
- the rotary module ``rotary_embedding`` returns is the one the forward calls, and its table
  is the one the spec describes (base, rotary dims, pair layout) for the default rope type;
- sliding layers as the cache itself reads the config; q/k norm modules present iff ``qk_norm``.
"""

from __future__ import annotations

import pytest
from family_oracle import ADAPTERS, TINY, TINY_IDS, tiny

from kvbridge.spec import SLIDING

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B, T = 2, 16
QK_NORM_NAMES = ("q_norm", "k_norm", "q_layernorm", "k_layernorm")


@pytest.fixture(scope="module")
def built():
    """(adapter, config, model, spec, cache after a 16-token forward, rotary calls) per variant."""
    cache_by_variant = {}

    def get(name: str, variant: str):
        key = (name, variant)
        if key not in cache_by_variant:
            adapter = ADAPTERS[name]
            cfg = tiny(name, variant)
            model = adapter.build_model(cfg)
            spec = adapter.spec_of(model)
            rot = adapter.rotary_embedding(model, 0)
            calls = []
            handle = rot.register_forward_hook(lambda *a: calls.append(1)) if rot is not None else None
            ids = torch.randint(0, spec.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
            cache = transformers.DynamicCache()
            with torch.no_grad():
                out = model(input_ids=ids, cache=cache, use_cache=True)
            if handle is not None:
                handle.remove()
            cache = getattr(out, "cache", None) or cache
            cache_by_variant[key] = (adapter, cfg, model, spec, cache, len(calls))
        return cache_by_variant[key]

    return get


@pytest.mark.parametrize("name,variant", TINY, ids=TINY_IDS)
def test_cache_geometry_matches_spec(built, name, variant):
    adapter, cfg, model, spec, cache, _ = built(name, variant)
    assert spec == adapter.describe(cfg)  # float32 config: spec_of adds nothing
    assert len(cache.layers) == spec.num_layers
    want = [B, spec.num_kv_heads, T, spec.head_dim]
    for i, layer in enumerate(cache.layers):
        assert list(layer.keys.shape) == want, f"layer {i} keys"
        assert list(layer.values.shape) == want, f"layer {i} values"


@pytest.mark.parametrize("name,variant", TINY, ids=TINY_IDS)
def test_rotary_module_is_the_one_used(built, name, variant):
    adapter, cfg, model, spec, cache, calls = built(name, variant)
    rot = adapter.rotary_embedding(model, 0)
    if spec.positional != "rope":
        assert rot is None
        return
    assert rot is not None and calls >= 1, "the model's forward never called the returned rotary module"
    if spec.rope_by_layer_type:  # Gemma3: one module, one table per layer type
        for layer in range(spec.num_layers):
            rope = spec.rope_for_layer(layer)
            _check_table(name, rot, rope, layer_type=spec.layer_type(layer))
    else:
        _check_table(name, rot, spec.rope)


def _check_table(name, rot, rope, layer_type=None):
    x = torch.zeros(1, 5, 8)
    pos = torch.arange(5)[None]
    out = rot(x, pos) if layer_type is None else rot(x, pos, layer_type)
    rd = rope.rotary_dim
    if name == "gptj":  # (sin, cos) at half width, repeat-interleaved inside attention
        sin, cos = out
        assert sin.shape[-1] * 2 == rd
    else:
        cos, sin = out
        assert cos.shape[-1] == rd
    if rope.rope_type != "default":
        return  # the scaled tables are checked by the RoPE codec tests
    inv = 1.0 / (rope.theta ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    angle = pos[0, :, None].float() * inv
    if name == "gptj":
        torch.testing.assert_close(sin[0], angle.sin())
        torch.testing.assert_close(cos[0], angle.cos())
        return
    full = torch.repeat_interleave(angle, 2, dim=-1) if rope.interleaved else torch.cat([angle, angle], -1)
    torch.testing.assert_close(cos[0], full.cos())
    torch.testing.assert_close(sin[0], full.sin())


@pytest.mark.parametrize("name,variant", TINY, ids=TINY_IDS)
def test_sliding_layers_as_the_cache_reads_them(built, name, variant):
    _, _, model, spec, _, _ = built(name, variant)
    layers = transformers.DynamicCache(config=model.config).layers
    assert len(layers) == spec.num_layers
    for i, layer in enumerate(layers):
        sliding = isinstance(layer, transformers.cache_utils.DynamicSlidingWindowLayer)
        assert sliding == (spec.layer_types[i] == SLIDING), f"layer {i}"
        if sliding:
            assert layer.sliding_window == spec.sliding_window


@pytest.mark.parametrize("name,variant", TINY, ids=TINY_IDS)
def test_qk_norm_modules_iff_spec_says_so(built, name, variant):
    _, _, model, spec, _, _ = built(name, variant)
    found = any(n.rsplit(".", 1)[-1] in QK_NORM_NAMES for n, _ in model.named_modules())
    assert found == spec.qk_norm


def test_sliding_variants_really_slide_in_16_tokens():
    """The tiny sliding windows are shorter than the 16-token tests that use them."""
    for name, variant in TINY:
        spec = ADAPTERS[name].describe(tiny(name, variant))
        if SLIDING in spec.layer_types:
            assert spec.sliding_window is not None and spec.sliding_window < T, (name, variant)
