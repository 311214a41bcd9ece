"""bench/bench_humaneval_pair.py's frontier conditions through llama.cpp, on SmolLM2 (its GGUF in
llama.cpp, the same GGUF dequantized in transformers, the identity mapping):

- ``truncated@1`` and ``tail@1`` are llama.cpp's own prefill of the prompt, bit for bit;
- ``truncated@R`` (llama.cpp refuses a gap in positions: the sinks' cells are relabelled, their keys
  keep their rotation) is transformers' forward of the kept tokens at their *original* positions, to
  the two runtimes' own noise, and clearly not the same tokens renumbered from 0;
- ``tail@R`` with an exact (identity) transfer is the target's own prefill, to the same noise.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.real, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_humaneval_pair.py"
PROMPT = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"
    "def factorial(n):\n    if n == 0:\n        return 1\n    return n * factorial(n - 1)\n\n\n"
    "def is_prime(n):\n    if n < 2:\n        return False\n    for i in range(2,"
)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_humaneval_pair", BENCH)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_frontier_conditions_through_llama_cpp(bench, smollm2, smollm2_ref, llama_session):
    import torch

    from kvbridge.engines.llamacpp import engine_model
    from kvbridge.plugins import get_host
    from kvbridge.transfer import IdentityMapping

    host = get_host()
    model, tok = smollm2.model.eval(), smollm2.tokenizer
    sad = host.adapter_for(model.config.to_dict())
    ids = list(tok(PROMPT, add_special_tokens=True)["input_ids"])
    kw = dict(
        big=llama_session,
        smodel=model,
        sad=sad,
        mapping=IdentityMapping(),
        target=engine_model(smollm2_ref.gguf_file, host=host),
        sink=2,
        tspec=sad.spec_of(model),
        host=host,
    )
    own = llama_session.prefill(ids)
    for cond in ("truncated@1", "tail@1"):
        assert np.array_equal(bench.frontier_first_logits(cond, ids, **kw), own), cond

    def tf(feed, pos):
        with torch.no_grad():
            return model(torch.tensor([feed]), position_ids=torch.tensor([pos])).logits[0, -1].float().numpy()

    kind, s, head = bench.frontier_split("truncated@0.25", len(ids), 2)
    assert (kind, s) == ("truncated", 2) and head == len(ids) - 1 - int(np.ceil(0.25 * (len(ids) - 1)))
    got = bench.frontier_first_logits("truncated@0.25", ids, **kw)
    feed = ids[:s] + ids[head:]
    original = tf(feed, list(range(s)) + list(range(head, len(ids))))
    renumbered = tf(feed, list(range(len(feed))))
    noise = float(np.abs(llama_session.prefill(ids) - tf(ids, list(range(len(ids))))).max())  # runtimes' own
    d_orig, d_ren = float(np.abs(got - original).max()), float(np.abs(got - renumbered).max())
    assert d_orig < 1.5 * noise + 0.1 and d_ren > 2 * d_orig, (d_orig, d_ren, noise)
    assert int(np.argmax(got)) == int(np.argmax(original))

    tail = bench.frontier_first_logits("tail@0.25", ids, **kw)
    assert float(np.abs(tail - own).max()) < 2 * noise + 0.1 and int(np.argmax(tail)) == int(np.argmax(own))
    assert float(np.abs(tail - got).max()) > 2 * noise  # the middle the truncation drops does matter here
