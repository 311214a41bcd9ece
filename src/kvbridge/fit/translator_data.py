"""What the ``translator`` fitter trains on, and its per-layer attention-output loss.

One more pass of both models over the calibration sequences (after the ridge's): per sequence
the source's content K/V (RoPE stripped, every layer), the ridge-mapped target cache (RoPE
applied as :func:`kvbridge.transfer.transfer` applies it), and, captured from the target's own
forward (:func:`kvbridge.evaluate.attention.capture_attention`), its queries at ``queries``
positions per sequence and the attention output those queries get from the target's native
K/V (the reference). Optionally the target's native next-token log-probabilities over the last
``suffix`` positions (the KL stage).

The loss of target layer ``t`` is the relative squared error of the attention output with the
mapped K/V against the native one, ``||attn(q, K_map, V_map) - attn(q, K, V)||² / ||attn(q, K, V)||²``
(causal, the target's GQA grouping, scaling and soft-capping; keys rotated as the target
rotates them); a step's loss is the mean over layers. Nothing is back-propagated through the
model: each layer's residual only moves its own layer's loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbridge.fit.translator_mapping import residual_delta, rotate


@dataclass
class TrainingData:
    """Stacked over sequences ``N`` (all of length ``T``): see the module docstring."""

    src_k: torch.Tensor  # [N, T, L_s, H_s·D_s] source content keys
    src_v: torch.Tensor  # [N, T, L_s, H_s·D_s] source values
    base_k: torch.Tensor  # [N, L_t, H_t, T, D_t] ridge-mapped keys, target RoPE applied
    base_v: torch.Tensor  # [N, L_t, H_t, T, D_t] ridge-mapped values
    q: torch.Tensor  # [N, L_t, H_q, Q, D_t] target queries (as its attention sees them)
    ref: torch.Tensor  # [N, L_t, H_q, Q, D_t] native attention outputs at those queries
    qpos: torch.Tensor  # [Q] query positions
    held: torch.Tensor  # [N] bool: held-out sequence
    tables: list  # per target layer: (cos, sin, rotary_dim, interleaved) or None (no RoPE)
    attn: list  # per target layer: {"scaling", "softcap", "window"}
    ids: torch.Tensor  # [N, T] token ids
    native_logp: torch.Tensor | None = None  # [N, S, V] target log-probs at the last S positions

    @property
    def train_index(self) -> torch.Tensor:
        return torch.nonzero(~self.held).flatten()

    @property
    def held_index(self) -> torch.Tensor:
        return torch.nonzero(self.held).flatten()

    def nbytes(self) -> int:
        ts = [self.src_k, self.src_v, self.base_k, self.base_v, self.q, self.ref]
        if self.native_logp is not None:
            ts.append(self.native_logp)
        return int(sum(t.numel() * t.element_size() for t in ts))


def query_positions(seq_len: int, queries: int) -> torch.Tensor:
    """``queries`` positions spread evenly over ``[seq_len // 8, seq_len)``, the last one included
    (0: every position). The first positions attend to few keys and say little about the map."""
    if queries <= 0 or queries >= seq_len:
        return torch.arange(seq_len)
    lo = seq_len // 8
    pos = torch.linspace(lo, seq_len - 1, queries).round().long()
    return torch.unique(pos)


def _mask(qpos: torch.Tensor, seq_len: int, window) -> torch.Tensor:
    keys = torch.arange(seq_len)
    allowed = keys[None, :] <= qpos[:, None]
    if window:
        allowed &= keys[None, :] > qpos[:, None] - int(window)
    return allowed[None, None]  # [1, 1, Q, T]


def collect(calibration, ridge, *, queries: int, suffix: int = 0, progress=None, host=None) -> TrainingData:
    """Run both models once over every calibration sequence (see the module docstring)."""
    from kvbridge import rope as rope_mod
    from kvbridge.evaluate.attention import attention_output, capture_attention
    from kvbridge.transfer import transfer

    cal = calibration
    host = host or cal.host
    sspec, tspec = cal.source_spec, cal.target_spec
    seq_len = cal.seq_len
    qpos = query_positions(seq_len, queries)
    parts: dict = {n: [] for n in ("src_k", "src_v", "base_k", "base_v", "q", "ref", "logp")}
    attn_meta: list = []
    tables: list = []
    order = list(range(cal.num_sequences))
    bs = cal.config.batch_size
    device = next(cal.target_model.parameters()).device
    positions = torch.arange(seq_len)[None]
    for ti in range(tspec.num_layers):
        if tspec.positional == "rope":
            rs = tspec.rope_for_layer(ti)
            cos, sin = rope_mod.tables(rs, positions, host=host)
            tables.append((cos, sin, rs.rotary_dim, rs.interleaved))
        else:
            tables.append(None)
    with torch.no_grad():
        for a in range(0, len(order), bs):
            idx = order[a : a + bs]
            ids = cal.sequences[idx].to(device)
            state = cal.source_adapter.extract(cal.source_model, ids, spec=sspec)
            content = state.strip_rope(host=host, dtype=torch.float32)
            parts["src_k"].append(torch.stack([k.float().transpose(1, 2).flatten(2) for k in content.keys], 2).cpu())
            parts["src_v"].append(torch.stack([v.float().transpose(1, 2).flatten(2) for v in content.values], 2).cpu())
            mapped = transfer(state, ridge, tspec, host=host)
            parts["base_k"].append(torch.stack([k.float() for k in mapped.keys], 1).cpu())
            parts["base_v"].append(torch.stack([v.float() for v in mapped.values], 1).cpu())
            with capture_attention(cal.target_model) as captured:
                kwargs = {"use_cache": False}
                if suffix:
                    kwargs["logits_to_keep"] = int(suffix)
                out = cal.target_model(input_ids=ids, **kwargs)
            qs, refs = [], []
            for ti in range(tspec.num_layers):
                c = captured[ti]
                if len(attn_meta) < tspec.num_layers:
                    attn_meta.append(
                        {"scaling": c["scaling"], "softcap": c["softcap"], "window": c.get("sliding_window")}
                    )
                meta = attn_meta[ti]
                q = c["q"][:, :, qpos.to(c["q"].device)].float()
                mask = _mask(qpos, seq_len, meta["window"]).to(q.device)
                ref = attention_output(q, c["k"], c["v"], mask, scaling=meta["scaling"], softcap=meta["softcap"])
                qs.append(q.cpu())
                refs.append(ref.cpu())
            parts["q"].append(torch.stack(qs, 1))
            parts["ref"].append(torch.stack(refs, 1))
            if suffix:
                logits = out.logits[:, -int(suffix) :].float()
                parts["logp"].append(torch.log_softmax(logits, dim=-1).cpu())
            del captured, out, state, content, mapped
            if progress is not None:
                progress(len(idx) * seq_len)
    cat = {n: torch.cat(v) if v else None for n, v in parts.items()}
    return TrainingData(
        src_k=cat["src_k"],
        src_v=cat["src_v"],
        base_k=cat["base_k"],
        base_v=cat["base_v"],
        q=cat["q"],
        ref=cat["ref"],
        qpos=qpos,
        held=cal.held.clone(),
        tables=tables,
        attn=attn_meta,
        ids=cal.sequences.clone(),
        native_logp=cat["logp"],
    )


def mapped_layer(data: TrainingData, params: dict, kind: str, layer: int, sources, rows, tokens=None):
    """``(K, V)`` of target ``layer`` for sequences ``rows``: the ridge cache plus the residual
    (keys rotated by the target's RoPE tables), over the first ``tokens`` positions (all: None)."""
    n = len(rows)
    t_all = data.src_k.shape[1]
    t = t_all if tokens is None else int(tokens)
    out = []
    for name, src, base in (("k", data.src_k, data.base_k), ("v", data.src_v, data.base_v)):
        x = src[rows][:, :t].index_select(2, torch.as_tensor([int(s) for s in sources]))
        delta = residual_delta(x.reshape(n, t, -1), params[(layer, name)], kind)
        b = base[rows, layer][:, :, :t]
        delta = delta.view(n, t, b.shape[1], b.shape[3]).transpose(1, 2)
        if name == "k" and data.tables[layer] is not None:
            cos, sin, rdim, inter = data.tables[layer]
            delta = rotate(delta, cos[:, :t], sin[:, :t], rdim, inter)
        out.append(b + delta)
    return out[0], out[1]


def layer_losses(data: TrainingData, params: dict, kind: str, selection, rows) -> torch.Tensor:
    """``[L_t]`` relative attention-output errors of the sequences ``rows`` (differentiable)."""
    from kvbridge.evaluate.attention import attention_output

    seq_len = data.src_k.shape[1]
    losses = []
    for layer, sources in enumerate(selection):
        k, v = mapped_layer(data, params, kind, layer, sources, rows)
        meta = data.attn[layer]
        mask = _mask(data.qpos, seq_len, meta["window"])
        got = attention_output(data.q[rows, layer], k, v, mask, scaling=meta["scaling"], softcap=meta["softcap"])
        ref = data.ref[rows, layer]
        losses.append(((got - ref) ** 2).sum() / (ref**2).sum().clamp_min(1e-30))
    return torch.stack(losses)


def cosines(data: TrainingData, params: dict, kind: str, selection, rows) -> torch.Tensor:
    """``[L_t]`` attention-output cosine vs native (heads concatenated, mean over the queries and
    sequences ``rows``), as ``kvbridge eval``'s ``attention_cosine`` measures it."""
    from kvbridge.evaluate.attention import attention_output

    seq_len = data.src_k.shape[1]
    out = []
    with torch.no_grad():
        for layer, sources in enumerate(selection):
            k, v = mapped_layer(data, params, kind, layer, sources, rows)
            meta = data.attn[layer]
            mask = _mask(data.qpos, seq_len, meta["window"])
            got = attention_output(data.q[rows, layer], k, v, mask, scaling=meta["scaling"], softcap=meta["softcap"])
            ref = data.ref[rows, layer]
            b, h, q, d = got.shape
            g = got.transpose(1, 2).reshape(b, q, h * d).double()
            r = ref.transpose(1, 2).reshape(b, q, h * d).double()
            out.append(torch.nn.functional.cosine_similarity(g, r, dim=-1, eps=1e-12).mean())
    return torch.stack(out)


def kl_loss(data: TrainingData, params: dict, kind: str, selection, rows, model) -> torch.Tensor:
    """Mean next-token KL(native || mapped) over the last ``S`` positions of sequences ``rows``:
    the first ``T - S`` tokens' cache is mapped (with the residual), the frozen target reads the
    last ``S`` tokens on it; gradients reach the residual through the cache only."""
    from transformers import DynamicCache

    s = data.native_logp.shape[1]
    t = data.src_k.shape[1]
    p = t - s
    cache = DynamicCache()
    device = next(model.parameters()).device
    for layer, sources in enumerate(selection):
        k, v = mapped_layer(data, params, kind, layer, sources, rows, tokens=p)
        cache.update(k.to(device), v.to(device), layer)
    ids = data.ids[rows][:, p:].to(device)
    logits = model(input_ids=ids, cache=cache, use_cache=True).logits.float()
    logp = torch.log_softmax(logits, dim=-1).cpu()
    native = data.native_logp[rows]
    return (native.exp() * (native - logp)).sum(-1).mean()


__all__ = ["TrainingData", "collect", "layer_losses", "cosines", "kl_loss", "query_positions", "mapped_layer"]
