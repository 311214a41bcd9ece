"""Shared fixtures of the steering tests: the zoo's base model and a few contrastive pairs."""

from __future__ import annotations

import pytest

PAIRS = [
    {"positive": "ROMEO: my sweet love, fair and gentle", "negative": "ROMEO: blood and death, kill and curse"},
    {"positive": "JULIET: O joy, my dear and noble love", "negative": "JULIET: O woe, foul villain and murder"},
    {"positive": "KING: good and gentle peace be with you", "negative": "KING: war and evil fear be with you"},
]


@pytest.fixture(scope="session")
def zoo_base():
    from kvbridge.models import load

    loaded = load("zoo:base")
    return loaded.model, loaded.tokenizer


@pytest.fixture(scope="session")
def pairs_file(tmp_path_factory):
    import json

    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    return path


@pytest.fixture(scope="session")
def zoo_vector(zoo_base, pairs_file):
    from kvbridge.steer.pairs import read_pairs
    from kvbridge.steer.vectors import build_vector

    model, tok = zoo_base
    return build_vector(model, tok, read_pairs(pairs_file))
