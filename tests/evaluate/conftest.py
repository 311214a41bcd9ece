"""Fixtures of the evaluation tests: a trained tiny Llama (the zoo's ``base``), samples it wrote
itself (no corpus needed), a perturbed mapping and a planted pair with a known exact mapping.

The machine these run on is small and shared: torch runs single-threaded here (restored
after), models are the zoo's 0.7M-parameter Llamas, and samples are short.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import pytest
import torch

P, C, G, N = 48, 8, 8, 12


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _zoo_or_skip(name: str):
    from kvbridge.zoo import model_dir

    if not (model_dir(name) / "model.safetensors").is_file():
        pytest.skip(f"zoo model {name!r} is not built")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    from kvbridge.zoo import load_zoo_model

    return load_zoo_model(name)


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
    extra = [(name, mod) for name, mod in (("kvbridge.builtin.fitters", fitters), ("kvbridge.builtin.metrics", metrics))
             if name not in {r.name for r in h.records}]
    return make_host(entry_points=False, extra=extra)


@pytest.fixture(scope="session")
def identity_result(base, samples, host):
    from kvbridge.builtin.identity import IdentityMapping
    from kvbridge.evaluate import evaluate

    model = base[0]
    return evaluate(model, model, IdentityMapping(), samples, prefix_len=P, continuation_len=C, greedy_tokens=G,
                    bootstrap=300, host=host, source_name="base", target_name="base")


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
        return replace(state, keys=tuple(noisy(k) for k in state.keys), values=tuple(noisy(v) for v in state.values),
                       spec=target_spec, rope_lengths=None, approximate=True)


@pytest.fixture(scope="session")
def noisy():
    return NoisyMapping


def _scaled_rotation(d: int, g: torch.Generator) -> torch.Tensor:
    """Per half-split RoPE pair (p, p + d/2) a scaled 2-D rotation: it commutes with RoPE."""
    r, half = torch.zeros(d, d), d // 2
    for p in range(half):
        phi = float(torch.rand(1, generator=g)) * 6.283
        s = 0.7 + 0.6 * float(torch.rand(1, generator=g))
        c, sn = s * torch.cos(torch.tensor(phi)), s * torch.sin(torch.tensor(phi))
        r[p, p], r[p, p + half], r[p + half, p], r[p + half, p + half] = c, sn, -sn, c
    return r


def planted_target(source, seed: int = 5):
    """``source`` reparametrised: per KV head an invertible map M on v (compensated in o_proj)
    and a scaled rotation R per RoPE pair on k (compensated by R^-T on the queries). The target
    computes the source's function exactly; its cache is a known linear map of the source's."""
    g = torch.Generator().manual_seed(seed)
    cfg = source.config
    d, heads, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    rep = heads // kv
    target = copy.deepcopy(source)
    with torch.no_grad():
        for layer in target.model.layers:
            att = layer.self_attn
            wq = att.q_proj.weight.view(heads, d, -1)
            wk = att.k_proj.weight.view(kv, d, -1)
            wv = att.v_proj.weight.view(kv, d, -1)
            wo = att.o_proj.weight.view(-1, heads, d)
            nq, nk, nv, no = wq.clone(), wk.clone(), wv.clone(), wo.clone()
            for j in range(kv):
                r = _scaled_rotation(d, g)
                q_, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
                m = q_ * (0.7 + 0.6 * torch.rand(d, generator=g))
                nk[j] = r.T @ wk[j]
                nv[j] = m.T @ wv[j]
                for i in range(j * rep, (j + 1) * rep):
                    nq[i] = torch.linalg.solve(r, wq[i])
                    no[:, i] = wo[:, i] @ torch.linalg.inv(m).T
            att.q_proj.weight.copy_(nq.reshape_as(att.q_proj.weight))
            att.k_proj.weight.copy_(nk.reshape_as(att.k_proj.weight))
            att.v_proj.weight.copy_(nv.reshape_as(att.v_proj.weight))
            att.o_proj.weight.copy_(no.reshape_as(att.o_proj.weight))
    return target.eval()


@pytest.fixture(scope="session")
def planted(base):
    return planted_target(base[0])
