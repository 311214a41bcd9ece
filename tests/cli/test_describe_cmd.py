"""``kvbridge describe`` reports the cache transformers really builds: keys and values with their own
widths (multi-head latent attention), chunked layers as the sliding window transformers caches."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvbridge.cli.main import cli
from kvbridge.conformance.tiny import tiny_config_dict


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
