"""kvbridge.transfer_run: ``kvbridge transfer`` as one library call on a loaded pair."""

from __future__ import annotations

import pytest

from kvbridge import api
from kvbridge.errors import ConfigError, KVBridgeError
from kvbridge.transfer_run import TransferSettings, check_generation_length, transfer_generate


@pytest.fixture(scope="module")
def same_pair():
    return api.load_pair("zoo:base", "zoo:base")


def test_identity_transfer_matches_the_native_continuation(same_pair):
    res = api.transfer_generate(
        same_pair, TransferSettings(mapping="identity", prompt="Once upon a time", max_new_tokens=4, compare=True)
    )
    assert res.tokens >= 1 and res.r2 is None and res.engine is None
    assert res.compared == 4 and res.agreement == 4 and res.text == res.native_text
    assert res.kl is not None and res.kl < 1e-6 and res.target_prefill_s >= 0


def test_without_compare_no_native_fields(same_pair):
    res = transfer_generate(
        same_pair, TransferSettings(mapping="identity", prompt="Once upon a time", max_new_tokens=2)
    )
    assert res.native_text is None and res.agreement is None and isinstance(res.text, str)


def test_a_one_token_prompt_is_refused(same_pair):
    with pytest.raises(ConfigError, match="fewer than 2 tokens"):
        transfer_generate(same_pair, TransferSettings(mapping="identity", prompt="a"))


def test_identity_needs_one_model():
    pair = api.load_pair("zoo:base", "zoo:wide")
    with pytest.raises(ConfigError, match="--mapping identity needs SOURCE and TARGET to be one model"):
        transfer_generate(pair, TransferSettings(mapping="identity", prompt="Once upon a time"))


def test_generation_length_names_the_flag():
    check_generation_length(10, 5, None)
    check_generation_length(10, 5, 15)
    with pytest.raises(KVBridgeError, match="--max-new-tokens 6 after a 10-token prompt"):
        check_generation_length(10, 6, 15)
    with pytest.raises(KVBridgeError, match="--prompt is 16 tokens"):
        check_generation_length(16, 0, 15)
