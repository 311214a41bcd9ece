"""Fixtures of the evaluation tests: a trained tiny Llama (the zoo's ``base``), samples it wrote
itself (no corpus needed), a perturbed mapping and a planted pair with a known exact mapping
(built by :mod:`kvbridge.testing.planted`).

The machine these run on is small and shared: torch runs single-threaded here (restored
after), models are the zoo's 0.7M-parameter Llamas, and samples are short.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

from kvbridge.testing.zoo import one_torch_thread, zoo_or_skip as _zoo_or_skip

P, C, G, N = 48, 8, 8, 12


_one_thread = pytest.fixture(scope="module", autouse=True)(one_torch_thread)


@pytest.fixture(scope="session")
def base():
    return _zoo_or_skip("base")


@pytest.fixture(scope="session")
def samples(base):
    from kvbridge.evaluate import model_samples

    return model_samples(base[0], n=N, length=P + C + 1, seed=11)


@pytest.fixture(scope="session")
def host():
    import kvbridge.builtin.fitters as fitters
    import kvbridge.builtin.metrics as metrics
    from kvbridge.plugins import make_host

    h = make_host(entry_points=False)
    extra = [
        (name, mod)
        for name, mod in (("kvbridge.builtin.fitters", fitters), ("kvbridge.builtin.metrics", metrics))
        if name not in {r.name for r in h.records}
    ]
    return make_host(entry_points=False, extra=extra)


@pytest.fixture(scope="session")
def identity_result(base, samples, host):
    from kvbridge.builtin.identity import IdentityMapping
    from kvbridge.evaluate import evaluate

    model = base[0]
    return evaluate(
        model,
        model,
        IdentityMapping(),
        samples,
        prefix_len=P,
        continuation_len=C,
        greedy_tokens=G,
        bootstrap=300,
        host=host,
        source_name="base",
        target_name="base",
    )


@dataclass(frozen=True)
class NoisyMapping:
    """The identity plus Gaussian noise of ``scale`` x each layer's std on content K and V."""

    scale: float
    seed: int = 0
    exact: bool = False
    name: str = "noisy-identity"

    def map_content(self, state, target_spec):
        g = torch.Generator().manual_seed(self.seed)
        noisy = lambda t: t + self.scale * t.std() * torch.randn(t.shape, generator=g)
        return replace(
            state,
            keys=tuple(noisy(k) for k in state.keys),
            values=tuple(noisy(v) for v in state.values),
            spec=target_spec,
            rope_lengths=None,
            approximate=True,
        )


@pytest.fixture(scope="session")
def noisy():
    return NoisyMapping


@pytest.fixture(scope="session")
def planted(base):
    """``base`` reparametrised (same geometry): its cache is a known linear map of base's
    (:func:`kvbridge.testing.planted.planted_pair`); it computes base's function exactly."""
    from kvbridge.testing.planted import planted_pair

    return planted_pair(base[0], insert_before=(), kv_dup=1, seed=5)[0]
