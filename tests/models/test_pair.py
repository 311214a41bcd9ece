"""A loaded model pair (kvbridge.models.pair): tokenizer check before weights, one load each, and the
Python API's fit keeping the loaded tokenizers (text calibration works from references)."""

from __future__ import annotations

import json
import shutil

import pytest

from kvbridge.errors import ConfigError
from kvbridge.models.pair import ModelPair, load_pair
from kvbridge.zoo import model_dir


def test_a_pair_shares_its_tokenizer_and_keeps_what_each_side_knows():
    pair = load_pair("zoo:base", "zoo:wide")
    assert isinstance(pair, ModelPair) and pair.tokenizer_note == ""
    assert pair.names == (pair.source.name, pair.target.name)
    assert pair.source.spec.num_layers != pair.target.spec.num_layers or pair.source.spec != pair.target.spec
    assert pair.source.tokenizer is not None and pair.target.tokenizer is not None
    assert not pair.same_model and load_pair("zoo:base", "zoo:base").same_model


def test_different_tokenizers_are_refused_before_any_weights_load(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(model_dir("base"), other)
    (other / "model.safetensors").write_bytes(b"not weights")  # would fail loudly if it were read
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids swapped: other token ids
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ConfigError, match="tokenizers of .* differ"):
        load_pair("zoo:base", str(other))


def test_api_fit_from_references_tokenizes_text_with_the_loaded_tokenizers():
    from kvbridge import api
    from kvbridge.fit.mapping import FittedMapping

    texts = [
        f"{i} To be, or not to be, that is the question: whether tis nobler in the mind to suffer " * 8
        for i in range(24)
    ]
    mapping = api.fit("zoo:base", "zoo:wide", texts, seq_len=64, tokens=1024, top_k=1)
    assert isinstance(mapping, FittedMapping)
    assert mapping.report is not None


def test_one_model_on_both_sides_is_loaded_once():
    pair = load_pair("zoo:base", "zoo:base")
    assert pair.source is pair.target and pair.same_model
