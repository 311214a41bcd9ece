"""The torch-free GGUF header reader on synthetic files written by tests/gguf_files.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvbridge.errors import ConfigError
from kvbridge.models import resolve
from kvbridge.models.gguf import GGUFArray, geometry, read_gguf, to_hf_config
from tests.gguf_files import tiny_llama_gguf, tiny_llama_metadata, tiny_llama_tensors, write_gguf


def test_geometry_quantization_and_tokenizer_facts(tmp_path):
    info = read_gguf(tiny_llama_gguf(tmp_path / "m.gguf"))
    geo = geometry(info)
    assert (geo["layers"], geo["heads"], geo["kv_heads"], geo["head_dim"]) == (2, 4, 2, 8)
    assert geo["tied_embeddings"] is True and geo["chat_template"] is True
    assert info.quantization == "Q4_1" and info.tensor_types["F32"] == 3
    cfg = to_hf_config(info)
    assert cfg["model_type"] == "llama" and cfg["vocab_size"] == 6 and cfg["rope_theta"] == 10000.0
    assert cfg["bos_token_id"] == 1 and cfg["torch_dtype"] == "float32"


def test_untied_and_rope_scaling(tmp_path):
    path = tiny_llama_gguf(
        tmp_path / "m.gguf", tied=False, llama__rope__scaling__type="linear", llama__rope__scaling__factor=2.0
    )
    cfg = to_hf_config(read_gguf(path))
    assert cfg["tie_word_embeddings"] is False
    assert cfg["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert resolve(str(path)).spec().rope.rope_type == "linear"


def test_large_arrays_are_hashed_not_decoded(tmp_path):
    tokens = [f"t{i}" for i in range(3000)]
    path = tiny_llama_gguf(
        tmp_path / "m.gguf",
        tokenizer__ggml__tokens=tokens,
        llama__vocab_size=None,
        tokenizer__ggml__token_type=[1] * 3000,
    )
    info = read_gguf(path)
    arr = info.metadata["tokenizer.ggml.tokens"]
    assert isinstance(arr, GGUFArray) and arr.count == 3000 and len(arr.sha256) == 64
    assert to_hf_config(info)["vocab_size"] == 3000


@pytest.mark.parametrize(
    "arch,model_type", [("qwen2", "qwen2"), ("qwen3", "qwen3"), ("phi3", "phi3"), ("gemma3", "gemma3_text")]
)
def test_other_architectures_map_to_transformers_types(tmp_path, arch, model_type):
    meta = {k.replace("llama.", f"{arch}."): v for k, v in tiny_llama_metadata().items()}
    meta["general.architecture"] = arch
    meta[f"{arch}.attention.key_length"] = 8
    cfg = to_hf_config(read_gguf(write_gguf(tmp_path / "m.gguf", meta, tiny_llama_tensors())))
    assert cfg["model_type"] == model_type and cfg["head_dim"] == 8


def test_mistral_is_recognised_by_name(tmp_path):
    path = tiny_llama_gguf(tmp_path / "m.gguf", general__name="Mistral 7B Instruct")
    assert to_hf_config(read_gguf(path))["model_type"] == "mistral"


def _err(path) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(str(path)).spec()
    text = info.value.one_line()
    assert "\n" not in text and str(path) in text and "(fix:" in text
    return text


def test_bad_files_are_one_line_errors(tmp_path):
    good = tiny_llama_gguf(tmp_path / "good.gguf").read_bytes()
    (tmp_path / "magic.gguf").write_bytes(b"GGML" + good[4:])
    assert "not a GGUF file" in _err(tmp_path / "magic.gguf")
    (tmp_path / "head.gguf").write_bytes(good[:200])
    assert "truncated" in _err(tmp_path / "head.gguf")
    (tmp_path / "tail.gguf").write_bytes(good[: len(good) - 700])
    assert "truncated" in _err(tmp_path / "tail.gguf")
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF\x03")
    assert "truncated" in _err(tmp_path / "tiny.gguf")
    (tmp_path / "v1.gguf").write_bytes(good[:4] + b"\x01\x00\x00\x00" + good[8:])
    assert "version 1" in _err(tmp_path / "v1.gguf")
    meta = dict(tiny_llama_metadata(), **{"general.architecture": "mamba"})
    assert "architecture 'mamba' is not supported" in _err(
        write_gguf(tmp_path / "arch.gguf", meta, tiny_llama_tensors())
    )
    odd = write_gguf(tmp_path / "qtype.gguf", tiny_llama_metadata(), tiny_llama_tensors("Q4_1"), type_ids={"Q4_1": 99})
    assert "unknown ggml type 99" in _err(odd)


def test_a_type_transformers_cannot_dequantize_is_refused_at_load(tmp_path):
    from kvbridge.models.loading import load_weights

    ref = resolve(str(tiny_llama_gguf(tmp_path / "q81.gguf", quant="Q8_1")))
    assert ref.quantization == "Q8_1"
    with pytest.raises(ConfigError, match="Q8_1 cannot be dequantized"):
        load_weights(ref, "float32")


def test_tokenizer_fingerprint_follows_the_metadata(tmp_path):
    from kvbridge.check.tokenizer_fp import compare

    a = resolve(str(tiny_llama_gguf(tmp_path / "a.gguf"))).tokenizer()
    b = resolve(str(tiny_llama_gguf(tmp_path / "b.gguf", general__name="other"))).tokenizer()
    c = resolve(str(tiny_llama_gguf(tmp_path / "c.gguf", tokenizer__ggml__merges=["b a"]))).tokenizer()
    assert a.digest == b.digest and a.vocab_size == 6 and a.num_added == 3
    assert compare(a, c)[0] == "blocking"


def test_describe_and_check_stay_torch_free(tmp_path):
    path = tiny_llama_gguf(tmp_path / "m.gguf")
    code = (
        "import sys, json; from kvbridge.cli.main import main\n"
        "try: main(['describe', sys.argv[1], '--json'])\n"
        "except SystemExit: pass\n"
        "try: main(['check', sys.argv[1], sys.argv[1], '--json'])\n"
        "except SystemExit: pass\n"
        "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True).stdout
    described = json.loads(out[: out.index("\n}\n") + 2])
    assert described["gguf"]["quantization"] == "Q4_1" and described["kind"] == "gguf"
    assert json.loads(out.strip().splitlines()[-1]) == []


def _load_counting(path, monkeypatch, *, once: bool):
    """``load(path)`` with gguf-py's reader counted; ``once=False`` switches :func:`parsed_once` off."""
    from contextlib import nullcontext

    import gguf as gguf_py

    import kvbridge.models.gguf as gguf_mod
    from kvbridge.models.loading import load

    built = []
    real = gguf_py.GGUFReader

    def counting(*args, **kwargs):
        built.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf_py, "GGUFReader", counting)
    if not once:
        monkeypatch.setattr(gguf_mod, "parsed_once", lambda active=True: nullcontext())
    loaded = load(str(path))
    monkeypatch.undo()
    return loaded, len(built)


def test_a_gguf_load_parses_the_file_once_with_the_same_result(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    path = tiny_llama_gguf(tmp_path / "m.gguf")
    plain, builds_plain = _load_counting(path, monkeypatch, once=False)
    once, builds_once = _load_counting(path, monkeypatch, once=True)
    assert builds_plain == 3 and builds_once == 1  # tokenizer, config, weights: one reader
    assert once.config == plain.config
    assert once.tokenizer.get_vocab() == plain.tokenizer.get_vocab()
    a, b = plain.model.state_dict(), once.model.state_dict()
    from_file = [k for k in a if ".mlp." not in k]  # the tiny file has no feed-forward tensors (random init)
    assert a.keys() == b.keys() and len(from_file) == 15 and all(a[k].equal(b[k]) for k in from_file)
    import gguf as gguf_py
    import transformers.modeling_gguf_pytorch_utils as legacy

    assert gguf_py.GGUFReader.__module__ == "gguf.gguf_reader"  # restored after the block
    assert legacy.load_gguf_checkpoint.__module__ == legacy.__name__


def test_the_type_tables_keep_their_ids():
    from kvbridge.models import gguf as G

    assert (G.GGML_TYPES[3], G.GGML_TYPES[9], G.GGML_TYPES[30], G.GGML_TYPES[39]) == (
        ("Q4_1", True),
        ("Q8_1", False),
        ("BF16", True),
        ("MXFP4", True),
    )
    assert 4 not in G.GGML_TYPES and 36 not in G.GGML_TYPES and len(G.GGML_TYPES) == 32
    assert (G.FILE_TYPES[4], G.FILE_TYPES[7], G.FILE_TYPES[15], G.FILE_TYPES[38]) == (
        "Q4_1_SOME_F16",
        "Q8_0",
        "Q4_K_M",
        "MXFP4_MOE",
    )
    assert 5 not in G.FILE_TYPES and 35 not in G.FILE_TYPES and len(G.FILE_TYPES) == 34
    assert G._SCALAR[G.BOOL] == "<?" and G._SCALAR[G.UINT64] == "<Q" and G.STRING not in G._SCALAR
