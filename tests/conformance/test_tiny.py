"""The tiny-config builder: sizes each config class accepts, features kept (the 16 types it used to miss)."""

from __future__ import annotations

import pytest

from kvbridge.conformance import tiny

ONCE_NOT_BUILT = [
    "cohere_compass_text",
    "dbrx",
    "dory",
    "dots3_note",
    "dots3_note_text",
    "gemma3n",
    "gemma4_assistant",
    "hrm_text",
    "inkling2_text",
    "inkling2_loop_text",
    "musicgen",
    "musicgen_melody",
    "reformer",
    "xlnet",
    "xmod",
    "zamba",
]


def _config(model_type):
    from transformers import AutoConfig

    data = tiny.tiny_config_dict(model_type)
    return data, AutoConfig.for_model(data["model_type"], **{k: v for k, v in data.items() if k != "model_type"})


@pytest.mark.parametrize("model_type", ONCE_NOT_BUILT)
def test_the_config_class_accepts_the_tiny_sizes(model_type):
    data, cfg = _config(model_type)
    text = cfg.get_text_config(decoder=True)
    assert getattr(text, "hidden_size", 64) <= 64 or getattr(text, "d_model", 64) <= 64


def test_family_features_survive_the_shrink():
    _, hrm = _config("hrm_text")  # one cache slot per (cycle, layer): H x (L + 1) x stack
    assert hrm.num_hidden_layers == hrm.num_layers_per_stack * hrm.H_cycles * (hrm.L_cycles + 1) == 8
    _, dory = _config("dory")  # input / recurrent (looped twice, a cache copy per loop) / output sections
    assert (dory.n_input_layers, dory.n_recurrent_layers, dory.n_output_layers, dory.n_recurrent_loops) == (1, 2, 1, 2)
    assert dory.recurrent_kv_cache_mode == "per_loop" and "full_attention" in dory.layer_types
    _, zamba = _config("zamba")  # at least two hybrid layers sharing one attention block
    assert zamba.layers_block_type.count("hybrid") == 2
    data, music = _config("musicgen")  # the causal LM is the decoder sub-config
    assert data["model_type"] == "musicgen_decoder" and music.num_codebooks == 1
    data, _ = _config("inkling2_text")
    assert data["unpadded_vocab_size"] <= data["vocab_size"]  # greedy tokens stay inside the embedding
    data, _ = _config("cohere_compass_text")
    assert sum(data["rope_parameters"]["full_attention"]["mrope_section"]) * 2 == data["head_dim"]


def test_a_timm_tower_is_left_out_only_while_building(monkeypatch):
    """gemma3n's vision tower is a timm model: without timm the text model is built alone, and noted."""
    from transformers import AutoModel
    from transformers.utils import is_timm_available

    if is_timm_available():
        pytest.skip("timm is installed: gemma3n builds whole")
    before = AutoModel.__dict__.get("from_config")
    model = tiny.build(tiny.tiny_config_dict("gemma3n"))
    assert "timm" in model.kvbridge_left_out
    assert not list(model.model.vision_tower.parameters())
    assert AutoModel.__dict__.get("from_config") is before  # the patch is gone
