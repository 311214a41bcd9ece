"""The LoRA reader/merger: equal to peft's own merge, no pickle, one-line errors; the shipped adapter's files."""

import json

import pytest
import torch

from kvbridge.adapters import SHIPPED, AdapterError, load_with_adapter, read_adapter


def _peft_adapter(tiny_llama, tmp_path, targets=("q_proj", "k_proj", "v_proj", "o_proj"), rank=4, alpha=8.0):
    from peft import LoraConfig, get_peft_model

    base = tiny_llama.model(seed=1)
    torch.manual_seed(3)
    pm = get_peft_model(
        tiny_llama.model(seed=1),
        LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False),
    )  # random A and B
    pm.save_pretrained(str(tmp_path / "lora"), safe_serialization=True)
    return base, pm, tmp_path / "lora"


def test_merge_matches_peft_merge_and_unload(tiny_llama, tmp_path):
    base, pm, folder = _peft_adapter(tiny_llama, tmp_path)
    ours = load_with_adapter(base, folder)
    theirs = pm.merge_and_unload()
    ref = dict(theirs.named_parameters())
    changed = 0
    for name, p in ours.named_parameters():
        assert torch.allclose(p, ref[name], atol=1e-6, rtol=0), name
        changed += not torch.equal(p, dict(base.named_parameters())[name])
    assert changed == 4 * tiny_llama.config["num_hidden_layers"]  # q, k, v, o of every layer, nothing else
    x = torch.tensor([[0, 5, 9, 17, 33, 2]])
    with torch.no_grad():
        assert torch.allclose(ours(input_ids=x).logits, theirs(input_ids=x).logits, atol=1e-5)
    info = read_adapter(folder)
    assert (info.rank, info.alpha, info.target_modules) == (4, 8.0, ("k_proj", "o_proj", "q_proj", "v_proj"))


def test_base_model_is_untouched(tiny_llama, tmp_path):
    base, _pm, folder = _peft_adapter(tiny_llama, tmp_path)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    load_with_adapter(base, folder)
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())


def test_pickle_weights_are_refused(tmp_path):
    d = tmp_path / "a"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]}))
    (d / "adapter_model.bin").write_bytes(b"\x80\x04not loaded")
    with pytest.raises(AdapterError, match="pickle.*never unpickles"):
        read_adapter(d)


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"peft_type": "IA3", "r": 8, "target_modules": ["q_proj"]}, "is not LORA"),
        ({"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"], "use_dora": True}, "use_dora"),
        ({"peft_type": "LORA", "r": 8, "target_modules": ".*proj"}, "regex"),
    ],
)
def test_unsupported_adapters_are_one_line_errors(tmp_path, cfg, match):
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(AdapterError, match=match) as exc:
        read_adapter(tmp_path)
    assert "\n" not in str(exc.value) and "(fix:" in str(exc.value)


def test_adapter_for_another_model_is_refused(tiny_llama, tmp_path):
    _base, _pm, folder = _peft_adapter(tiny_llama, tmp_path)
    other = tiny_llama.model(seed=1, hidden_size=64, intermediate_size=64)
    with pytest.raises(AdapterError, match="shape"):
        load_with_adapter(other, folder)


def test_shipped_adapter_is_small_safetensors_with_its_recipe():
    files = sorted(p.name for p in SHIPPED.iterdir())
    assert {"adapter_config.json", "adapter_model.safetensors", "recipe.json", "README.md"} <= set(files)
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl", ".pickle"))]
    assert (SHIPPED / "adapter_model.safetensors").stat().st_size < 8 * 2**20
    info = read_adapter(SHIPPED)
    assert info.rank == 8 and info.target_modules == ("k_proj", "o_proj", "q_proj", "v_proj")
    from safetensors import safe_open

    with safe_open(str(SHIPPED / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert len(keys) == 2 * 4 * 30  # A and B for q, k, v, o of SmolLM2's 30 layers
    rec = info.recipe
    assert rec["recipe"]["train_slice"] == [0.5, 0.7] and rec["recipe"]["heldout_slice"] == [0.8, 0.9]
    res = rec["result"]
    assert res["adapter_nll"] < res["base_nll"]  # the recorded held-out measurement (recomputed by a real test)
