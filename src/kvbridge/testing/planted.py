"""Planted ground truth for fitters: a target that is a known linear map of its source's cache.

``planted_pair(source)`` reparametrises a Llama-layout source model (``q/k/v/o_proj``,
half-split RoPE) into a target that computes **exactly the source's function** while its
cache is a known linear function of the source's cache:

- values: per target KV head an invertible ``M`` on ``v``, compensated in ``o_proj``
  (``Wo_i <- Wo_i M^-T`` for the query heads that read that KV head);
- keys: per target KV head, per RoPE frequency pair ``(p, p + D/2)`` a scaled rotation ``R``
  (it commutes with RoPE), compensated on the queries of that group (``Wq_i <- R^-1 Wq_i``),
  so ``q·k`` is unchanged at every position;
- ``kv_dup``: each source KV head becomes ``kv_dup`` target KV heads (reparametrised copies),
  query head ``i`` reading target KV head ``i // (heads / (H_s·kv_dup))``;
- ``insert_before``: identity layers (``o_proj = 0``, ``down_proj = 0``) are inserted before
  those source layers; their attention weights copy the next layer's, so their cache is a
  function of that layer's cache.

It returns ``(target, truth)``: ``truth[t]`` is the source layer whose content K/V determine
target layer ``t`` exactly. :func:`tiny_llama` builds a small random source.
"""

from __future__ import annotations

import copy

from kvbridge.plugins import make_host


def tiny_llama(*, layers: int = 4, vocab: int = 128, seed: int = 0, **overrides):
    """A small random Llama (hidden 64, 4 query heads, 2 KV heads) for planted fits."""
    return llama_model(llama_config(num_hidden_layers=layers, vocab_size=vocab, **overrides), seed=seed)


def llama_config(**overrides) -> dict:
    """The planted tests' Llama config: 4 layers, vocab 128, weights large enough to matter."""
    from kvbridge.builtin.families._common import tiny_base

    cfg = tiny_base(
        "llama",
        num_hidden_layers=4,
        vocab_size=128,
        max_position_embeddings=256,
        initializer_range=0.25,
        tie_word_embeddings=False,
    )
    cfg.update(overrides)
    return cfg


def llama_model(cfg: dict, seed: int = 0):
    """A model of ``cfg`` through its family adapter (seeded random weights)."""
    return make_host(entry_points=False).adapter_for(cfg).build_model(cfg, seed=seed).eval()


def _scaled_rotation(d: int, g):
    """Per half-split RoPE pair (p, p + d/2) a 2x2 block s * [[c, s'], [-s', c]] (row-vector action)."""
    import torch

    r = torch.zeros(d, d)
    half = d // 2
    for p in range(half):
        phi = float(torch.rand(1, generator=g)) * 6.283
        s = 0.6 + 1.2 * float(torch.rand(1, generator=g))
        c, sn = s * torch.cos(torch.tensor(phi)), s * torch.sin(torch.tensor(phi))
        r[p, p], r[p, p + half], r[p + half, p], r[p + half, p + half] = c, sn, -sn, c
    return r


def _invertible(d: int, g):
    import torch

    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    scales = 0.6 + 1.2 * torch.rand(d, generator=g)
    return q * scales + 0.2 * torch.randn(d, d, generator=g) / d**0.5


def planted_pair(source, *, insert_before=(1, 3), kv_dup: int = 2, seed: int = 123):
    """``(target_model, truth)`` reparametrised from ``source`` (see the module docstring)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    scfg = source.config
    heads, hs = scfg.num_attention_heads, scfg.num_key_value_heads
    d = getattr(scfg, "head_dim", None) or scfg.hidden_size // heads
    layout = []  # (source layer, is_identity)
    for s in range(scfg.num_hidden_layers):
        layout += [(s, True), (s, False)] if s in insert_before else [(s, False)]
    ht = hs * kv_dup
    if heads % ht:
        raise ValueError(f"{heads} query heads cannot share {ht} KV heads (kv_dup={kv_dup})")
    tcfg = copy.deepcopy(scfg)
    tcfg.num_hidden_layers, tcfg.num_key_value_heads = len(layout), ht
    if getattr(tcfg, "layer_types", None):
        tcfg.layer_types = [scfg.layer_types[s] for s, _ in layout]
    torch.manual_seed(seed)
    target = type(source)(tcfg)
    src = source.state_dict()
    new = copy.deepcopy(target.state_dict())
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        if name in src:
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
            for name in ("post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
                new[f"{tp}{name}.weight"] = src[f"{sp}{name}.weight"].clone()
    target.load_state_dict(new)
    return target.eval(), [s for s, _ in layout]


def token_ids(n_seq: int, seq_len: int = 48, *, vocab: int = 128, seed: int = 0):
    """``[n_seq, seq_len]`` uniform random token ids (seeded)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n_seq, seq_len), generator=g)
