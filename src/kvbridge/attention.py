"""Attention capture for the ``attention_cosine`` metric: a registered attention function that
records each layer's query, and the attention output recomputed from a cache (eager math, GQA,
scaling and soft-capping as the model's own attention)."""

from __future__ import annotations

import contextlib
import sys

import torch

# -- attention capture ------------------------------------------------------------------------------
_CAPTURE_NAME = "kvbridge_capture"
_STORE: dict = {"active": None}


def _orig_attention(name: str, module):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[name]
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward as fn
    return fn


def _capture_forward(module, query, key, value, attention_mask, **kwargs):
    active = _STORE["active"]
    if active is None:  # pragma: no cover - only reachable if a model keeps the name after the context
        return _orig_attention("sdpa", module)(module, query, key, value, attention_mask, **kwargs)
    layer = int(getattr(module, "layer_idx", len(active["layers"])))
    if active.get("reduce") is not None:  # keep only what the caller reduces the layer to
        active["layers"][layer] = active["reduce"](
            query.detach(), key.detach(), value.detach(), kwargs.get("scaling"), kwargs.get("softcap")
        )
    else:
        rows = active["rows"]  # keep the first `rows` batch rows only (None: all)

        def keep(t):
            return (t if rows is None or t.shape[0] == 1 else t[:rows]).detach().clone()

        active["layers"][layer] = {
            "q": keep(query.float()),
            "k": keep(key.float()),
            "v": keep(value.float()),
            "mask": None if attention_mask is None else keep(attention_mask),
            "scaling": kwargs.get("scaling"),
            "softcap": kwargs.get("softcap"),
            "sliding_window": kwargs.get("sliding_window"),
        }
    return _orig_attention(active["impl"], module)(module, query, key, value, attention_mask, **kwargs)


@contextlib.contextmanager
def capture_attention(model, rows: int | None = None, reduce=None):
    """Record every layer's queries, keys, values and mask during forwards inside the block.

    The model's own attention implementation still computes the output (logits unchanged);
    the capturing function is installed by name for the block only and removed after.
    ``rows``: record only the first ``rows`` batch rows (the native ones of a stacked forward).
    ``reduce(query, key, value, scaling, softcap)``: record its result per layer instead of the
    tensors (bounded memory: e.g. the attention-repair weights of :mod:`kvbridge.fit.repair`).
    """
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    config = model.config
    impl = getattr(config, "_attn_implementation", None) or "eager"
    AttentionInterface.register(_CAPTURE_NAME, _capture_forward)
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS[impl] if impl in ALL_MASK_ATTENTION_FUNCTIONS else eager_mask
    AttentionMaskInterface.register(_CAPTURE_NAME, mask_fn)
    store = {"impl": impl, "layers": {}, "rows": rows, "reduce": reduce}
    prev = _STORE["active"]
    _STORE["active"] = store
    config._attn_implementation = _CAPTURE_NAME
    try:
        yield store["layers"]
    finally:
        config._attn_implementation = impl
        _STORE["active"] = prev


def attention_output(q, k, v, mask=None, *, scaling=None, softcap=None) -> torch.Tensor:
    """Eager softmax attention ``[B, Hq, Tq, D]`` (float32) with GQA repeat and the captured mask."""
    q, k, v = q.float(), k.float(), v.float()
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scaling = q.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    tq, tk = scores.shape[-2], scores.shape[-1]
    if mask is None:  # causal with the cache offset
        qpos = torch.arange(tq, device=q.device)[:, None] + (tk - tq)
        allowed = torch.arange(tk, device=q.device)[None, :] <= qpos
        scores = scores.masked_fill(~allowed, float("-inf"))
    elif mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask[..., :tq, :tk], float("-inf"))
    else:
        scores = scores + mask[..., :tq, :tk].float()
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def attention_cosines(captured: dict, state, prefix_len: int) -> torch.Tensor:
    """Per sample, per layer: cosine of attention outputs with native vs ``state``'s prefix K/V."""
    out = []
    for layer in range(len(captured)):
        c = captured[layer]
        kw = {"scaling": c["scaling"], "softcap": c["softcap"]}
        if "ref_out" not in c:  # the native output: computed once per capture, shared by every condition
            ref = attention_output(c["q"], c["k"], c["v"], c["mask"], **kw)
            c["ref_out"] = ref.transpose(1, 2).flatten(2).double()  # [B, T, H * D]
        a = c["ref_out"]
        k = torch.cat([state.keys[layer].float(), c["k"][:, :, prefix_len:]], dim=2)
        v = torch.cat([state.values[layer].float(), c["v"][:, :, prefix_len:]], dim=2)
        g = attention_output(c["q"], k, v, c["mask"], **kw).transpose(1, 2).flatten(2)
        out.append(torch.nn.functional.cosine_similarity(a, g.double(), dim=-1, eps=1e-12).mean(dim=1).float())
    return torch.stack(out, dim=1)  # [B, L]
