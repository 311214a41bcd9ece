"""``describe`` on GGUF files: the counted and the stated type, the memory the weights take."""

from __future__ import annotations

import json

from click.testing import CliRunner

from kvbridge.cli.main import cli
from kvbridge.testing.gguf import tiny_llama_gguf, tiny_llama_tensors


def _describe(*args) -> str:
    res = CliRunner().invoke(cli, ["describe", *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_the_stated_type_is_shown_beside_the_counted_one(tmp_path):
    # llama.cpp's Q4_K_M mixes types; a file where most tensors are another type says both
    path = tiny_llama_gguf(tmp_path / "m.gguf", quant="Q4_1", general__file_type=15)
    out = _describe(str(path))
    assert "Q4_1 by tensor count (Q4_1 x8, F32 x3, Q8_0 x1); the file states Q4_K_M" in out
    assert "float32 as loaded (weights Q4_K_M, dequantized)" in out
    data = json.loads(_describe(str(path), "--json"))
    assert data["gguf"]["file_type"] == "Q4_K_M" and data["gguf"]["quantization"] == "Q4_1"
    same = tiny_llama_gguf(tmp_path / "s.gguf", quant="Q4_1", general__file_type=3)
    assert "Q4_1 (Q4_1 x8, F32 x3, Q8_0 x1) (as the file states)" in _describe(str(same))
    none = tiny_llama_gguf(tmp_path / "n.gguf", quant="Q4_1", general__file_type=None)
    assert json.loads(_describe(str(none), "--json"))["gguf"]["file_type"] is None


def test_weights_memory_in_float32_and_bfloat16(tmp_path):
    path = tiny_llama_gguf(tmp_path / "m.gguf")
    params = 0
    for _name, shape, _type in tiny_llama_tensors():
        n = 1
        for d in shape:
            n *= d
        params += n
    data = json.loads(_describe(str(path), "--json"))["load_memory"]
    assert data == {"params": params, "how": "counted from the GGUF tensors", "float32": 4 * params,
                    "bfloat16": 2 * params}
    assert "weights in memory" in _describe(str(path)) and "in bfloat16 (--dtype)" in _describe(str(path))
    zoo = json.loads(_describe("zoo:base", "--json"))["load_memory"]
    assert zoo["how"] == "estimated from the config" and zoo["float32"] == 2 * zoo["bfloat16"] > 0
