"""The built-in baseline: same-model identity transfer is exact for every built-in family."""

from __future__ import annotations

import pytest

from kvbridge.plugins import make_host
from kvbridge.testing import contract

HOST = make_host(entry_points=False)
CASES = [(a.name, v, cfg) for a in HOST.adapters() for v, cfg in contract.adapter_configs(a).items()]
IDS = [f"{n}-{v}" for n, v, _ in CASES]


def _adapter(name):
    return HOST.registry("adapter").get(name)


def test_every_required_family_is_built_in():
    required = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3",
                "stablelm", "gpt_neox", "gptj", "cohere", "falcon", "gpt2", "olmo2"}
    assert required <= set(HOST.registry("family").names())


@pytest.mark.parametrize("name,variant,cfg", CASES, ids=IDS)
def test_extracted_shapes_match_spec(name, variant, cfg):
    contract.check_extract_shapes(_adapter(name), cfg, host=HOST)


@pytest.mark.parametrize("name,variant,cfg", CASES, ids=IDS)
def test_identity_transfer_is_exact(name, variant, cfg):
    res = contract.check_identity_transfer(_adapter(name), cfg, host=HOST)
    assert res.tokens_equal and res.max_logit_diff <= 1e-6
    # and against plain generate on the whole prompt (a different prefill split)
    assert res.max_logit_diff_generate <= 1e-5


@pytest.mark.parametrize("name,variant,cfg", CASES, ids=IDS)
def test_shifted_prefix_matches_model_at_those_positions(name, variant, cfg):
    try:
        contract.check_shifted_identity(_adapter(name), cfg, host=HOST)
    except contract.NotApplicable as why:
        pytest.skip(str(why))
