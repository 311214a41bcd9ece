"""What the ``translator`` fitter trains on, and its per-layer attention-output loss.

One more pass of both models over the calibration sequences (after the ridge's): per sequence
the features each target layer's map reads (the content K/V of its selected source layers,
RoPE stripped), the ridge-mapped target cache (RoPE applied as :func:`kvbridge.transfer.transfer`
applies it), and, captured from the target's own forward
(:func:`kvbridge.attention.capture_attention`), its queries at ``queries`` positions per
sequence and the attention output those queries get from the target's native K/V (the
reference). Optionally the target's native next-token log-probabilities over the last
``suffix`` positions (the KL stage).

The loss of target layer ``t`` is the relative squared error of the attention output with the
mapped K/V against the native one, ``||attn(q, K_map, V_map) - attn(q, K, V)||² / ||attn(q, K, V)||²``
(causal, the target's GQA grouping, scaling and soft-capping; keys rotated as the target
rotates them); a step's loss is the mean over layers. Nothing is back-propagated through the
model: each layer's residual only moves its own layer's loss. Every layer is computed at once
(the layers are a batch dimension): on a busy CPU the number of operations matters as much as
their size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbridge.fit.solve import FitError
from kvbridge.fit.translator_mapping import features, rotate, stacked_delta


@dataclass
class TrainingData:
    """Stacked over sequences ``N`` (all of length ``T``) and target layers ``L``."""

    x: dict  # "k"/"v": [N, L, T, F] features each target layer's map reads (normalised once fixed)
    base: dict  # "k"/"v": [N, L, H_t, T, D_t] ridge-mapped cache (keys with the target's RoPE)
    q: torch.Tensor  # [N, L, H_q, Q, D_t] target queries (as its attention sees them)
    ref: torch.Tensor  # [N, L, H_q, Q, D_t] native attention outputs at those queries
    qpos: torch.Tensor  # [Q] query positions
    mask: torch.Tensor  # [L, Q, T] bool: key allowed for the query (causal, sliding window)
    scaling: torch.Tensor  # [L] score scaling per layer
    softcap: float | None
    rope: tuple | None  # (cos [L, T, r], sin [L, T, r], rotary_dim r, interleaved) or None (no RoPE)
    held: torch.Tensor  # [N] bool: held-out sequence
    ids: torch.Tensor  # [N, T] token ids
    native_logp: torch.Tensor | None = None  # [N, S, V] target log-probs at the last S positions

    @property
    def train_index(self) -> torch.Tensor:
        return torch.nonzero(~self.held).flatten()

    @property
    def held_index(self) -> torch.Tensor:
        return torch.nonzero(self.held).flatten()

    def nbytes(self) -> int:
        ts = [*self.x.values(), *self.base.values(), self.q, self.ref, self.native_logp]
        return int(sum(t.numel() * t.element_size() for t in ts if t is not None))


def query_positions(seq_len: int, queries: int) -> torch.Tensor:
    """``queries`` positions spread evenly over ``[seq_len // 8, seq_len)``, the last one included
    (0: every position). The first positions attend to few keys and say little about the map."""
    if queries <= 0 or queries >= seq_len:
        return torch.arange(seq_len)
    return torch.unique(torch.linspace(seq_len // 8, seq_len - 1, queries).round().long())


def _mask(qpos: torch.Tensor, seq_len: int, window) -> torch.Tensor:
    keys = torch.arange(seq_len)
    allowed = keys[None, :] <= qpos[:, None]
    if window:
        allowed &= keys[None, :] > qpos[:, None] - int(window)
    return allowed  # [Q, T]


def _rope_tables(tspec, seq_len: int, host):
    if tspec.positional != "rope":
        return None
    from kvbridge import rope as rope_mod

    specs = [tspec.rope_for_layer(ti) for ti in range(tspec.num_layers)]
    dims = {(rs.rotary_dim, rs.interleaved) for rs in specs}
    if len(dims) != 1:
        raise FitError(
            "the translator needs one RoPE layout (rotary dims, interleaving) across the target's layers",
            "use --fitter ridge for this target",
        )
    tables = [rope_mod.tables(rs, torch.arange(seq_len)[None], host=host) for rs in specs]  # ([1, T, r], [1, T, r])
    return torch.stack([c[0] for c, _ in tables]), torch.stack([s[0] for _, s in tables]), *dims.pop()


def collect(calibration, ridge, *, queries: int, suffix: int = 0, progress=None) -> TrainingData:
    """Run both models once over every calibration sequence (see the module docstring)."""
    from kvbridge.attention import attention_output, capture_attention
    from kvbridge.transfer import transfer

    cal = calibration
    sspec, tspec = cal.source_spec, cal.target_spec
    seq_len, lt = cal.seq_len, tspec.num_layers
    qpos = query_positions(seq_len, queries)
    parts: dict = {n: [] for n in ("xk", "xv", "bk", "bv", "q", "ref", "logp")}
    meta: list = []
    bs = cal.config.batch_size
    device = next(cal.target_model.parameters()).device
    with torch.no_grad():
        for a in range(0, cal.num_sequences, bs):
            idx = list(range(a, min(cal.num_sequences, a + bs)))
            ids = cal.sequences[idx].to(device)
            state = cal.source_adapter.extract(cal.source_model, ids, spec=sspec)
            content = state.strip_rope(host=cal.host, dtype=torch.float32)
            for name, layers in (("xk", content.keys), ("xv", content.values)):
                parts[name].append(features([t.float().cpu() for t in layers], ridge.layers))  # [B, L, T, k·fs]
            mapped = transfer(state, ridge, tspec, host=cal.host)
            parts["bk"].append(torch.stack([k.float().cpu() for k in mapped.keys], 1))
            parts["bv"].append(torch.stack([v.float().cpu() for v in mapped.values], 1))
            with capture_attention(cal.target_model) as captured:
                keep = {"logits_to_keep": int(suffix)} if suffix else {}
                out = cal.target_model(input_ids=ids, use_cache=False, **keep)
            qs, refs = [], []
            for ti in range(lt):
                c = captured[ti]
                if len(meta) < lt:
                    meta.append({"scaling": c["scaling"], "softcap": c["softcap"], "window": c.get("sliding_window")})
                m = meta[ti]
                q = c["q"][:, :, qpos.to(c["q"].device)].float()
                mask = _mask(qpos, seq_len, m["window"]).to(q.device)[None, None]
                ref = attention_output(q, c["k"], c["v"], mask, scaling=m["scaling"], softcap=m["softcap"])
                qs.append(q.cpu())
                refs.append(ref.cpu())
            parts["q"].append(torch.stack(qs, 1))
            parts["ref"].append(torch.stack(refs, 1))
            if suffix:
                parts["logp"].append(torch.log_softmax(out.logits[:, -int(suffix) :].float(), dim=-1).cpu())
            del captured, out, state, content, mapped
            if progress is not None:
                progress(len(idx) * seq_len)
    caps = {m["softcap"] for m in meta}
    if len(caps) != 1:
        raise FitError("the translator needs one attention soft-cap across the target's layers", "use --fitter ridge")
    cat = {n: torch.cat(v) if v else None for n, v in parts.items()}
    head_dim = cat["q"].shape[-1]
    return TrainingData(
        x={"k": cat["xk"], "v": cat["xv"]},
        base={"k": cat["bk"], "v": cat["bv"]},
        q=cat["q"],
        ref=cat["ref"],
        qpos=qpos,
        mask=torch.stack([_mask(qpos, seq_len, m["window"]) for m in meta]),
        scaling=torch.tensor([head_dim**-0.5 if m["scaling"] is None else float(m["scaling"]) for m in meta]),
        softcap=caps.pop(),
        rope=_rope_tables(tspec, seq_len, cal.host),
        held=cal.held.clone(),
        ids=cal.sequences.clone(),
        native_logp=cat["logp"],
    )


def mapped(data: TrainingData, params: dict, kind: str, rows, tokens=None) -> tuple:
    """``(K, V)`` ``[B, L, H_t, T', D_t]`` of sequences ``rows`` over the first ``tokens`` positions:
    the ridge cache plus the residual (keys rotated by the target's RoPE tables)."""
    out = []
    for name in ("k", "v"):
        x = data.x[name][rows]
        base = data.base[name][rows]
        if tokens is not None:
            x, base = x[:, :, :tokens], base[:, :, :, :tokens]
        b, lt, h, t, d = base.shape
        dl = stacked_delta(x, params[name], kind).view(b, lt, t, h, d).transpose(2, 3)
        if name == "k" and data.rope is not None:
            # per-layer tables [L, T, r]: the layers are their batch, so the residual [B, L, H, T, D]
            # is rotated as [L, B*H, T, D]
            cos, sin, rdim, inter = data.rope
            dl = rotate(dl.transpose(0, 1).reshape(lt, b * h, t, d), cos[:, :t], sin[:, :t], rdim, inter)
            dl = dl.view(lt, b, h, t, d).transpose(0, 1)
        out.append(base + dl)
    return out[0], out[1]


def attention(data: TrainingData, k: torch.Tensor, v: torch.Tensor, rows) -> torch.Tensor:
    """``[B, L, H_q, Q, D]`` attention outputs of the stored queries of ``rows`` over ``k``/``v``
    ``[B, L, H_t, T, D]`` (GQA without copying the keys: the query heads of a group share a row)."""
    q = data.q[rows]
    b, lt, hq, nq, d = q.shape
    ht = k.shape[2]
    g = hq // ht
    qg = q.reshape(b, lt, ht, g * nq, d)
    scores = (qg @ k.transpose(-1, -2)) * data.scaling.view(1, lt, 1, 1, 1)
    if data.softcap is not None:
        scores = torch.tanh(scores / data.softcap) * data.softcap
    mask = data.mask.repeat(1, g, 1)[None, :, None]  # [1, L, 1, G·Q, T]
    scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).reshape(b, lt, hq, nq, d)


def layer_losses(data: TrainingData, params: dict, kind: str, rows) -> torch.Tensor:
    """``[L]`` relative attention-output errors of the sequences ``rows`` (differentiable)."""
    k, v = mapped(data, params, kind, rows)
    got = attention(data, k, v, rows)
    ref = data.ref[rows]
    return ((got - ref) ** 2).sum((0, 2, 3, 4)) / (ref**2).sum((0, 2, 3, 4)).clamp_min(1e-30)


def measure(data: TrainingData, params: dict, kind: str, rows) -> dict | None:
    """Loss and attention-output cosine per layer over ``rows`` (one sequence at a time), as
    ``kvbridge eval``'s ``attention_cosine`` measures it (heads concatenated, mean over queries)."""
    if len(rows) == 0:
        return None
    err = tot = cos = 0.0
    with torch.no_grad():
        for r in rows.tolist():
            one = torch.tensor([r])
            k, v = mapped(data, params, kind, one)
            got = attention(data, k, v, one)[0].double()  # [L, H, Q, D]
            ref = data.ref[r].double()
            err = err + ((got - ref) ** 2).sum((1, 2, 3))
            tot = tot + (ref**2).sum((1, 2, 3))
            lt, h, nq, d = got.shape
            g2 = got.transpose(1, 2).reshape(lt, nq, h * d)
            r2 = ref.transpose(1, 2).reshape(lt, nq, h * d)
            cos = cos + torch.nn.functional.cosine_similarity(g2, r2, dim=-1, eps=1e-12).mean(1)
    losses = err / tot.clamp_min(1e-30)
    cos = cos / len(rows)
    return {
        "loss": float(losses.mean()),
        "loss_layers": [round(float(x), 6) for x in losses],
        "attention_cosine_mean": float(cos.mean()),
        "attention_cosine_min": float(cos.min()),
        "attention_cosine_layers": [round(float(x), 6) for x in cos],
    }


def kl_loss(data: TrainingData, params: dict, kind: str, rows, model) -> torch.Tensor:
    """Mean next-token KL(native || mapped) over the last ``S`` positions of sequences ``rows``:
    the first ``T - S`` tokens' cache is mapped (with the residual), the frozen target reads the
    last ``S`` tokens on it; gradients reach the residual through the cache only."""
    from transformers import DynamicCache

    s = data.native_logp.shape[1]
    p = data.ids.shape[1] - s
    k, v = mapped(data, params, kind, rows, tokens=p)
    device = next(model.parameters()).device
    cache = DynamicCache()
    for layer in range(k.shape[1]):
        cache.update(k[:, layer].to(device), v[:, layer].to(device), layer)
    logits = model(input_ids=data.ids[rows][:, p:].to(device), cache=cache, use_cache=True).logits.float()
    logp = torch.log_softmax(logits, dim=-1).cpu()
    native = data.native_logp[rows]
    return (native.exp() * (native - logp)).sum(-1).mean()
