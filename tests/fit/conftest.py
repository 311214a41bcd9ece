"""Planted ground truth for the fitting tests.

A target model is built from a tiny source Llama by function-preserving reparametrisation, so
it computes exactly the source's function while its cache is a *known* linear function of
the source's cache:

- values: per target KV head an invertible ``M`` on ``v``, compensated in ``o_proj``
  (``Wo_i <- Wo_i M^-T`` for the query heads that read that KV head);
- keys: per target KV head, per RoPE frequency pair ``(p, p + D/2)`` a scaled rotation ``R``
  (it commutes with RoPE), compensated by ``R^-T`` on the queries of that group
  (``Wq_i <- R^-1 Wq_i``), so ``q·k`` is unchanged at every position;
- head-count mismatch: the source's 2 KV heads (4 query heads) become 4 KV heads, target KV
  head ``j`` a reparametrised copy of source KV head ``j // 2``, query head ``i`` reading KV
  head ``i``;
- depth mismatch: identity layers (``o_proj = 0``, ``down_proj = 0``) are inserted before
  some source layers; their attention weights copy the next layer's, so their cache is a
  function of that layer's cache (their true source layer is the next one).

``truth[t]`` is the source layer whose content K/V determine target layer ``t`` exactly.
"""

from __future__ import annotations

import copy

import pytest
import torch

from kvbridge.builtin.families._common import tiny_base
from kvbridge.plugins import make_host

HOST = make_host(entry_points=False)
SEQ_LEN = 48


def host():
    """An isolated host with the built-in plugins (fitters included)."""
    return make_host(entry_points=False)


def llama_config(**kw) -> dict:
    cfg = tiny_base("llama", num_hidden_layers=4, vocab_size=128, max_position_embeddings=256,
                    initializer_range=0.25, tie_word_embeddings=False)
    cfg.update(kw)
    return cfg


def build(cfg: dict, seed: int):
    adapter = HOST.adapter_for(cfg)
    return adapter.build_model(cfg, seed=seed)


def _scaled_rotation(d: int, g: torch.Generator) -> torch.Tensor:
    """Per half-split RoPE pair (p, p + d/2) a 2x2 block s * [[c, s'], [-s', c]] (row-vector action)."""
    r = torch.zeros(d, d)
    half = d // 2
    for p in range(half):
        phi = float(torch.rand(1, generator=g)) * 6.283
        s = 0.6 + 1.2 * float(torch.rand(1, generator=g))
        c, sn = s * torch.cos(torch.tensor(phi)), s * torch.sin(torch.tensor(phi))
        r[p, p], r[p, p + half], r[p + half, p], r[p + half, p + half] = c, sn, -sn, c
    return r


def _invertible(d: int, g: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    scales = 0.6 + 1.2 * torch.rand(d, generator=g)
    return q * scales + 0.2 * torch.randn(d, d, generator=g) / d ** 0.5


def planted_target(source, *, insert_before=(1, 3), kv_dup=2, seed=123):
    """``(target_model, truth)`` reparametrised from ``source`` (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    scfg = source.config.to_dict()
    hs, heads, d = scfg["num_key_value_heads"], scfg["num_attention_heads"], scfg["head_dim"] or \
        scfg["hidden_size"] // scfg["num_attention_heads"]
    ls = scfg["num_hidden_layers"]
    layout = []  # (source layer, is_identity)
    for s in range(ls):
        if s in insert_before:
            layout.append((s, True))
        layout.append((s, False))
    ht = hs * kv_dup
    assert heads % ht == 0
    tcfg = llama_config(num_hidden_layers=len(layout), num_key_value_heads=ht,
                        **{k: scfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                "num_attention_heads", "max_position_embeddings")})
    target = build(tcfg, seed=seed)
    src = source.state_dict()
    new = copy.deepcopy(target.state_dict())
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        new[name] = src[name].clone()
    n_rep_t = heads // ht
    for t, (s, ident) in enumerate(layout):
        sp, tp = f"model.layers.{s}.", f"model.layers.{t}."
        wq = src[sp + "self_attn.q_proj.weight"].view(heads, d, -1)
        wk = src[sp + "self_attn.k_proj.weight"].view(hs, d, -1)
        wv = src[sp + "self_attn.v_proj.weight"].view(hs, d, -1)
        wo = src[sp + "self_attn.o_proj.weight"].view(-1, heads, d)
        nk, nv = torch.empty(ht, d, wk.shape[-1]), torch.empty(ht, d, wv.shape[-1])
        nq, no = wq.clone(), wo.clone()
        for j in range(ht):
            base = j // kv_dup  # source KV head this target KV head copies
            r, m = _scaled_rotation(d, g), _invertible(d, g)
            nk[j] = r.T @ wk[base]
            nv[j] = m.T @ wv[base]
            for i in range(j * n_rep_t, (j + 1) * n_rep_t):  # query heads reading target KV head j
                nq[i] = torch.linalg.solve(r, wq[i])  # R^-1 Wq_i
                no[:, i] = wo[:, i] @ torch.linalg.inv(m).T  # Wo_i M^-T
        new[tp + "self_attn.q_proj.weight"] = nq.reshape(heads * d, -1)
        new[tp + "self_attn.k_proj.weight"] = nk.reshape(ht * d, -1)
        new[tp + "self_attn.v_proj.weight"] = nv.reshape(ht * d, -1)
        new[tp + "input_layernorm.weight"] = src[sp + "input_layernorm.weight"].clone()
        if ident:  # zero attention output and zero MLP output: the layer is the identity
            new[tp + "self_attn.o_proj.weight"] = torch.zeros_like(new[tp + "self_attn.o_proj.weight"])
            new[tp + "mlp.down_proj.weight"] = torch.zeros_like(new[tp + "mlp.down_proj.weight"])
        else:
            new[tp + "self_attn.o_proj.weight"] = no.reshape(-1, heads * d)
            for name in ("post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                         "mlp.down_proj.weight"):
                new[tp + name] = src[sp + name].clone()
    target.load_state_dict(new)
    return target.eval(), [s for s, _ in layout]


def token_ids(n_seq: int, seq_len: int = SEQ_LEN, *, vocab: int = 128, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n_seq, seq_len), generator=g)


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

    mapping = fit(planted["source"], planted["target"], planted["ids"], top_k=2, stride=2, host=fit_host,
                  distributed=None)
    return mapping
