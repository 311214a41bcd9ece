"""The shipped LoRA's recipe (tools/train_lora.py): its held-out loss gain reproduces with the
recipe's own slices and scoring (SmolLM2-135M: marked `real`)."""

import os

import pytest


@pytest.fixture(scope="module")
def pair():
    from kvbridge.adapters import AdapterError, load_adapter_pair

    try:
        return load_adapter_pair()
    except AdapterError as exc:  # the model file is missing
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


@pytest.mark.real
def test_adapter_lowers_heldout_loss_as_recorded(pair, shared_dir):
    from kvbridge.corpus import slice_text
    from kvbridge.evaluate import windows
    from tools.train_lora import RECIPE, encode, heldout_nll

    text = (shared_dir / "corpora" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    ids = encode(pair.tokenizer, slice_text(text, *RECIPE.heldout_slice))
    held = windows(ids, 32, RECIPE.heldout_len + 1)[::4]  # 8 of the recipe's 32 windows
    diff = heldout_nll(pair.tuned, held) - heldout_nll(pair.base, held)
    assert (diff < 0).all(), diff  # every window: the merged adapter is better on held-out Shakespeare
    recorded = pair.adapter.recipe["result"]["nll_diff_mean"]
    assert abs(float(diff.mean()) - recorded) < 0.15, (float(diff.mean()), recorded)
