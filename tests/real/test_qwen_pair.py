"""The real model family: Qwen2.5-Coder-0.5B and 1.5B-Instruct (Q4_K_M GGUFs from PyPI slices).

Marked ``pair`` (not ``real``, which is SmolLM2's; ``-m "not pair"`` leaves them out). When the
two files are not cached these tests are skipped with the command that fetches them, except
under ``CI=true``, where the ``pair`` fixture fetches them into ``$KVBRIDGE_HOME`` first (``make
models`` does it before the suite; 1.6 GB). The header tests read no tensor; the identity tests
load each model in float32 in turn (the 1.5B: 1.78G params, 7.1 GB) and run one short prompt.
"""

from __future__ import annotations

import gc
import os
import time

import pytest

pytestmark = pytest.mark.pair  # not `real` (SmolLM2 only): the fresh-clone check runs `-m real` under CI

SMALL, BIG = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
CODE = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n'


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def pair():
    from kvbridge.models.fetching import fetch
    from kvbridge.models.known import PAIR, known

    models = [known(n) for n in PAIR]
    missing = [m.name for m in models if not m.cached]
    if missing:
        if not _ci():
            pytest.skip(
                f"{', '.join(missing)} not fetched; run `kvbridge models fetch pair` (1.6 GB; "
                "CI=true fetches it, `make models` under CI does)"
            )
        for name in missing:
            fetch(name)
    return {m.name: m for m in models}


def test_headers_say_what_the_issue_says(pair):
    from kvbridge.models import resolve

    small, big = resolve(SMALL), resolve(BIG)
    s, b = small.spec(), big.spec()
    assert (s.num_layers, s.num_attention_heads, s.num_kv_heads, s.head_dim, s.hidden_size) == (24, 14, 2, 64, 896)
    assert (b.num_layers, b.num_attention_heads, b.num_kv_heads, b.head_dim, b.hidden_size) == (28, 12, 2, 128, 1536)
    assert s.model_type == b.model_type == "qwen2"
    assert not small.gguf.tied_embeddings and not big.gguf.tied_embeddings  # both files ship output.weight
    assert small.gguf.stated_type == big.gguf.stated_type == "Q4_K_M"
    assert small.gguf.quantization == "Q5_0"  # by tensor count: the reason describe shows both
    ts, tb = small.tokenizer(), big.tokenizer()
    assert ts.digest == tb.digest and ts.vocab_size == tb.vocab_size


def test_describe_and_check_on_the_pair(pair):
    import json

    from click.testing import CliRunner

    from kvbridge.cli.main import cli

    run = CliRunner()
    out = run.invoke(cli, ["describe", SMALL])
    assert out.exit_code == 0 and "the file states Q4_K_M" in out.output and "in bfloat16" in out.output
    data = json.loads(run.invoke(cli, ["describe", BIG, "--json"]).output)
    mem = data["load_memory"]
    assert 1.7e9 < mem["params"] < 1.85e9 and mem["float32"] == 2 * mem["bfloat16"] == 4 * mem["params"]
    res = run.invoke(cli, ["check", SMALL, BIG, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["verdict"] == "mappable"
    axes = {a["name"]: a for a in report["axes"]}
    assert axes["tokenizer"]["verdict"] == "same" and axes["kv_heads"]["verdict"] == "same"
    assert axes["head_dim"]["verdict"] == axes["layers"]["verdict"] == "mappable"


@pytest.fixture(scope="module", params=[SMALL, BIG])
def loaded(request, pair):
    """One model in float32 at a time (dequantized from the GGUF), freed before the next."""
    import resource

    import torch

    from kvbridge.models import load, resolve

    torch.manual_seed(0)
    t0 = time.perf_counter()
    lm = load(resolve(request.param))
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{request.param}: loaded in {secs:.1f} s, peak RSS so far {rss:.2f} GiB")
    yield lm
    del lm
    gc.collect()


def test_identity_transfer_is_bitwise_in_float32(loaded):
    """Extract -> identity transfer -> inject -> generate has the very tokens and logits of the
    model's own cached continuation (no threshold: bit for bit on any CPU)."""
    from kvbridge.demo.real import identity_check

    assert loaded.spec.dtype == "float32"
    ids = loaded.tokenizer(CODE, add_special_tokens=False)["input_ids"]
    assert 20 <= len(ids) <= 60
    res = identity_check(loaded.model, ids, new_tokens=3)
    print(res)
    assert res.state_equal and res.tokens_equal and res.max_logit_diff == 0.0, res
