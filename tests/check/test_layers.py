"""Per-layer differences: NoPE layers, MLA latent caches, recurrent state."""

from __future__ import annotations

from kvbridge.check import compat
from kvbridge.check.layers import layout_axis, nope_note
from kvbridge.spec import ModelSpec, RopeSpec


def spec(**kw) -> ModelSpec:
    return ModelSpec(
        kw.pop("model_type", "x"),
        kw.pop("layers", 4),
        4,
        kw.pop("kv", 2),
        kw.pop("head_dim", 16),
        64,
        rope=RopeSpec(head_dim=16),
        **kw,
    )


def test_nope_note_names_the_layers():
    assert nope_note(spec(nope_layers=(3,)), spec(nope_layers=(3,))) == ""
    note = nope_note(spec(nope_layers=(1, 3)), spec())
    assert "[1, 3] are NoPE only in the source" in note


def test_mla_blocks_cross_model_fitting():
    mla = spec(
        kv=1,
        head_dim=512,
        value_head_dim=64,
        cache_format="mla",
        latent=(("kv_lora_rank", 512), ("qk_rope_head_dim", 64)),
    )
    base = compat.Axis("cache_format", "dynamic", "dynamic", "same", "")
    axis = layout_axis(mla, spec(), base, same_model=False)
    assert axis.verdict == "blocking" and "rank 512" in axis.action
    assert layout_axis(mla, mla, base, same_model=True) is base
