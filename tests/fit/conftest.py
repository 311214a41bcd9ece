"""Planted ground truth for the fitting tests: the builder is :mod:`kvbridge.testing.planted`
(its docstring describes the construction); ``truth[t]`` is the source layer whose content
K/V determine target layer ``t`` exactly.
"""

from __future__ import annotations

import pytest
import torch

from kvbridge.plugins import make_host
from kvbridge.testing.planted import llama_config, llama_model, planted_pair, token_ids

HOST = make_host(entry_points=False)
SEQ_LEN = 48


def host():
    """An isolated host with the built-in plugins (fitters included)."""
    return make_host(entry_points=False)


def build(cfg: dict, seed: int):
    return llama_model(cfg, seed=seed)


def planted_target(source, *, insert_before=(1, 3), kv_dup=2, seed=123):
    return planted_pair(source, insert_before=insert_before, kv_dup=kv_dup, seed=seed)


@pytest.fixture(scope="session")
def fit_host():
    return host()


@pytest.fixture(scope="session")
def planted():
    torch.manual_seed(0)
    source = build(llama_config(), seed=0)
    target, truth = planted_target(source)
    return {"source": source, "target": target, "truth": truth, "ids": token_ids(40)}


@pytest.fixture(scope="session")
def planted_fit(planted, fit_host):
    from kvbridge.fit import fit

    mapping = fit(
        planted["source"], planted["target"], planted["ids"], top_k=2, stride=2, host=fit_host, distributed=None
    )
    return mapping
