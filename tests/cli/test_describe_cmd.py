"""``kvbridge describe`` reports the cache transformers really builds: keys and values with their own
widths (multi-head latent attention), chunked layers as the sliding window transformers caches; on
GGUF files the counted and the stated type, and the memory the weights take."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvbridge.cli.main import cli
from kvbridge.conformance.tiny import tiny_config_dict
from tests.gguf_files import tiny_llama_gguf, tiny_llama_tensors


def _cache_layer(config: dict):
    import torch
    import transformers

    from kvbridge.models.hf_loader import config_for_model

    data = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "transformers_version")}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_for_model(config["model_type"], **data)).eval()
    with torch.no_grad():
        cache = model(torch.arange(1, 13).unsqueeze(0), use_cache=True).past_key_values
    return cache.layers[0]


def _describe(tmp_path, config: dict, *args: str):
    folder = tmp_path / config["model_type"]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    res = CliRunner().invoke(cli, ["describe", str(folder), *args])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3"])
def test_latent_attention_reports_key_and_value_widths_of_the_real_cache(tmp_path, model_type):
    config = tiny_config_dict(model_type)
    layer = _cache_layer(config)
    k, v = layer.keys.shape[-1], layer.values.shape[-1]
    assert k != v  # the case this test is about
    text = _describe(tmp_path, config)
    assert f"K {k}, V {v}" in text
    spec = json.loads(_describe(tmp_path / "j", config, "--json") if (tmp_path / "j").mkdir() is None else "")["spec"]
    assert (spec["head_dim"], spec["value_head_dim"]) == (k, v)


def test_chunked_layers_are_reported_as_the_sliding_window_transformers_caches(tmp_path):
    config = tiny_config_dict("llama4_text")
    layer = _cache_layer(config)
    window = getattr(layer, "sliding_window", None)
    assert type(layer).__name__ == "DynamicSlidingWindowLayer" and window
    text = _describe(tmp_path, config)
    assert f"cached as a sliding window of {window}" in text


def _run_describe(*args) -> str:
    res = CliRunner().invoke(cli, ["describe", *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_the_stated_type_is_shown_beside_the_counted_one(tmp_path):
    # llama.cpp's Q4_K_M mixes types; a file where most tensors are another type says both
    path = tiny_llama_gguf(tmp_path / "m.gguf", quant="Q4_1", general__file_type=15)
    out = _run_describe(str(path))
    assert "Q4_1 by tensor count (Q4_1 x8, F32 x3, Q8_0 x1); the file states Q4_K_M" in out
    assert "float32 as loaded (weights Q4_K_M, dequantized)" in out
    data = json.loads(_run_describe(str(path), "--json"))
    assert data["gguf"]["file_type"] == "Q4_K_M" and data["gguf"]["quantization"] == "Q4_1"
    same = tiny_llama_gguf(tmp_path / "s.gguf", quant="Q4_1", general__file_type=3)
    assert "Q4_1 (Q4_1 x8, F32 x3, Q8_0 x1) (as the file states)" in _run_describe(str(same))
    none = tiny_llama_gguf(tmp_path / "n.gguf", quant="Q4_1", general__file_type=None)
    assert json.loads(_run_describe(str(none), "--json"))["gguf"]["file_type"] is None


def test_weights_memory_in_float32_and_bfloat16(tmp_path):
    path = tiny_llama_gguf(tmp_path / "m.gguf")
    params = 0
    for _name, shape, _type in tiny_llama_tensors():
        n = 1
        for d in shape:
            n *= d
        params += n
    data = json.loads(_run_describe(str(path), "--json"))["load_memory"]
    assert data == {
        "params": params,
        "how": "counted from the GGUF tensors",
        "float32": 4 * params,
        "bfloat16": 2 * params,
    }
    assert "weights in memory" in _run_describe(str(path)) and "in bfloat16 (--dtype)" in _run_describe(str(path))
    zoo = json.loads(_run_describe("zoo:base", "--json"))["load_memory"]
    assert zoo["how"] == "estimated from the config" and zoo["float32"] == 2 * zoo["bfloat16"] > 0
