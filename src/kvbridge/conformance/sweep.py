"""The conformance sweep: every causal-LM model type of transformers against kvbridge.

For each model type: build a tiny random model (:mod:`kvbridge.conformance.tiny`), describe it
through the adapter lookup, and check the description against the cache the model really
produces, then run identity transfer through the full path. Each type lands in one class:

- ``exact``: every fact right, greedy tokens identical, next-token logits within ``LOGIT_TOL``;
- ``refused``: kvbridge refuses it with a one-line reason (what differs in its cache);
- ``not-built``: transformers could not build or run the tiny model (not kvbridge's);
- ``wrong``: a fact of the description differs from the real cache, or identity is not exact;
- ``crash``: kvbridge raised something other than a one-line refusal.

Facts compared (per layer): cache layer count; K/V heads and head dims as cached; window of
sliding / chunked layers (``DynamicCache(config=...)``, what ``generate`` builds); layers with no
KV of their own, with recurrent state; dtype; and the positional scheme of every layer: the
state re-positioned by ``SHIFT`` must equal the model's own cache of the same tokens computed at
the shifted positions (a NoPE layer's keys stay put, a RoPE layer's rotate by the stated table).
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from kvbridge.builtin.families import hf_cache
from kvbridge.conformance import tiny
from kvbridge.errors import KVBridgeError
from kvbridge.plugins import host_or_default
from kvbridge.testing.contract import NotApplicable, random_ids

CLASSES = ("exact", "refused", "not-built", "wrong", "crash")
LOGIT_TOL = 1e-5
KEY_TOL = 1e-4
SHIFT = 5
PROMPT = 12


@dataclass(frozen=True)
class Result:
    model_type: str
    status: str  # one of CLASSES
    adapter: str = ""
    reason: str = ""
    layers: int = 0
    kinds: str = ""  # short per-layer layout ("full", "4 sliding + 2 full", ...)
    positional: str = ""
    max_logit_diff: float | None = None
    max_key_diff: float | None = None
    seconds: float = 0.0
    notes: tuple = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)


def _short(exc: BaseException, limit: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _layout(spec) -> str:
    counts = Counter(spec.layer_types or ("full_attention",) * spec.num_layers)
    names = {
        "full_attention": "full",
        "sliding_attention": f"sliding {spec.sliding_window}",
        "chunked_attention": f"chunked {spec.attention_chunk_size}",
        "linear_attention": "recurrent",
        "shared_kv": "shared-KV",
        "no_attention": "no-attention",
    }
    text = " + ".join(f"{n} {names.get(k, k)}" for k, n in counts.items())
    if spec.nope_layers:
        text += f", NoPE {list(spec.nope_layers)}"
    return text


def compare_facts(model, spec, adapter, *, seed: int = 0) -> tuple[list[str], float | None]:
    """Wrong facts of ``spec`` against the model's own cache, and the max key difference of the
    shifted-position check (None when it does not apply)."""
    import torch
    from transformers import DynamicCache

    wrong = []
    ids = random_ids(min(spec.vocab_size or 128, 200), 1, PROMPT, seed + 3)
    m = copy.deepcopy(model)
    with torch.no_grad():
        out = m(input_ids=ids, use_cache=True)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if cache is None:  # the model fills a cache it is given but returns none (XLM): give it generate's own
        cache, m = hf_cache.reference_cache(model), copy.deepcopy(model)
        with torch.no_grad():
            m(input_ids=ids, cache=cache, use_cache=True)
    cache = getattr(cache, "self_attention_cache", cache)  # decoders of encoder-decoder families
    layers = list(getattr(cache, "layers", []) or [])
    side = getattr(cache, "linear_cache", None)  # MiniMaxCache keeps lightning-attention state beside its layers
    if side is not None and len(side) > len(layers):  # and adds layers only up to the last attention layer
        layers += [None] * (len(side) - len(layers))
    if len(layers) != spec.num_layers:
        return [f"cache has {len(layers)} layers, described {spec.num_layers}"], None
    windowed = DynamicCache(config=model.config).layers if isinstance(cache, DynamicCache) else layers
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if spec.dtype != dtype:
        wrong.append(f"dtype {spec.dtype} != model {dtype}")
    for i, layer in enumerate(layers):
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        has_kv = k is not None and hasattr(k, "dim") and k.dim() == 4 and k.numel() > 0
        if has_kv != (i in spec.kv_layers):
            wrong.append(f"layer {i}: cache {'holds' if has_kv else 'has no'} K/V, described the opposite")
            continue
        has_state = hasattr(layer, "recurrent_states") or (
            side is not None and i < len(side) and isinstance(side[i], torch.Tensor)
        )
        if has_state != (i in spec.state_layers):
            wrong.append(f"layer {i}: recurrent state {'present' if has_state else 'absent'}, described the opposite")
        ik = getattr(layer, "indexer_keys", None)
        if (ik is not None) != (i in spec.indexer_layers):
            wrong.append(f"layer {i}: indexer keys {'present' if ik is not None else 'absent'}, described the opposite")
        elif ik is not None and (ik.dim() != 3 or ik.shape[-1] != spec.indexer_dim() or str(ik.dtype) != str(k.dtype)):
            wrong.append(
                f"layer {i}: indexer keys {tuple(ik.shape)} {ik.dtype}, described [B, T, {spec.indexer_dim()}]"
            )
        if has_kv:
            want_k = (1, spec.kv_heads_of(i), spec.key_dim_of(i))
            want_v = (1, spec.kv_heads_of(i), spec.value_dim_of(i))
            if (k.shape[0], k.shape[1], k.shape[3]) != want_k or (v.shape[0], v.shape[1], v.shape[3]) != want_v:
                wrong.append(
                    f"layer {i}: K {tuple(k.shape)} V {tuple(v.shape)}, described [B, {want_k[1]}, T, "
                    f"{want_k[2]}] / [B, {want_v[1]}, T, {want_v[2]}]"
                )
            if str(k.dtype).removeprefix("torch.") != dtype:
                wrong.append(f"layer {i}: cached dtype {k.dtype}")
        if i < len(windowed):
            real = getattr(windowed[i], "sliding_window", None)
            real = int(real) if real is not None else None
            if has_kv and real != spec.window_of(i):
                wrong.append(f"layer {i}: window {real}, described {spec.window_of(i)}")
    diff = None
    if not wrong and spec.positional in ("rope", "none", "alibi") and not (spec.rope and spec.rope.is_stateful):
        diff, shift_wrong = _shift_check(model, spec, adapter, ids)
        wrong += shift_wrong
    return wrong, diff


def _shift_check(model, spec, adapter, ids):
    """Re-positioned state vs the model's own cache at shifted positions, per layer."""
    import torch

    state = adapter.extract(copy.deepcopy(model), ids)
    moved = state.reposition(SHIFT) if spec.positional == "rope" else state  # alibi / none: keys position-free
    ref_model = copy.deepcopy(model)
    cache = hf_cache.new_cache(ref_model, full_history=True)
    pos = torch.arange(SHIFT, SHIFT + ids.shape[1])[None]
    try:
        with torch.no_grad():
            ref_model(input_ids=ids, cache=cache, position_ids=pos, use_cache=True)
    except TypeError:
        return None, []  # the model takes no position ids: positions cannot be shifted
    worst, wrong = 0.0, []
    # the slot that carries RoPE (MLA: the shared RoPE key in the values slot), and indexer keys
    slot = "values" if spec.cache_format == "mla" else "keys"
    pairs = [
        (i, slot, getattr(cache.layers[i], slot), getattr(moved, slot)[i], getattr(state, slot)[i])
        for i in spec.kv_layers
    ]
    got_idx, own_idx = dict(moved.indexer_keys), dict(state.indexer_keys)
    pairs += [
        (i, "indexer keys", getattr(cache.layers[i], "indexer_keys", None), got_idx.get(i), own_idx.get(i))
        for i in spec.indexer_layers
    ]
    for i, what_slot, ref, got, own in pairs:
        if ref is None or got is None or tuple(ref.shape) != tuple(got.shape):
            wrong.append(f"layer {i}: shifted cache {what_slot} shape {None if ref is None else tuple(ref.shape)}")
            continue
        d = float((ref - got).abs().max())
        scale = max(1.0, float(ref.abs().max()))
        worst = max(worst, d / scale)
        if d > KEY_TOL * scale:
            unshifted = float((ref - own).abs().max())
            what = "NoPE (keys do not move)" if unshifted <= KEY_TOL * scale else "rotated differently"
            wrong.append(
                f"layer {i}: positional scheme {spec.positional_of(i)} of its {what_slot} wrong, model's "
                f"{what_slot} are {what} (max diff {d:.1e})"
            )
    return worst, wrong[:4]


def run_type(model_type: str, *, host=None, seed: int = 0) -> Result:
    """Classify one model type (see the module doc)."""
    import torch

    from kvbridge.testing.contract import check_identity_transfer  # looked up per call: tests replace it

    host = host_or_default(host)
    t0 = time.perf_counter()
    done = lambda status, **kw: Result(model_type, status, seconds=round(time.perf_counter() - t0, 2), **kw)  # noqa: E731
    stage, base = "config", {}
    try:  # each stage's failure lands in its class (see the handler below)
        data = tiny.tiny_config_dict(model_type)
        stage = "refusal"
        try:  # a refusal from the config alone stands whether or not the tiny model builds
            host.adapter_for(data).describe(data)
        except KVBridgeError:
            raise
        except Exception:
            pass  # judged below, against the built model
        stage = "build"
        model = tiny.build(data, seed)
        with torch.no_grad():
            vocab = getattr(model.config.get_text_config(decoder=True), "vocab_size", 128) or 128
            model(input_ids=random_ids(min(vocab, 200), 1, 4, 0))
        stage = "describe"
        adapter = host.adapter_for(data)
        spec = adapter.spec_of(model)
        left_out = getattr(model, "kvbridge_left_out", "")  # a part the builder could not build (not the cache's)
        base = dict(
            adapter=adapter.name,
            layers=spec.num_layers,
            kinds=_layout(spec),
            positional=spec.positional,
            notes=(left_out,) if left_out else (),
        )
        stage = "facts"
        wrong, base["max_key_diff"] = compare_facts(model, spec, adapter, seed=seed)
        if wrong:
            return done("wrong", reason="; ".join(wrong[:4]), **base)
        stage = "identity"
        res = check_identity_transfer(
            adapter, None, model=model, prompt_len=PROMPT, new_tokens=4, seed=seed, tol=LOGIT_TOL
        )
    except Exception as exc:
        if stage in ("config", "build"):  # transformers could not build or run it: not kvbridge's
            return done("not-built", reason=("config: " if stage == "config" else "") + _short(exc))
        if isinstance(exc, KVBridgeError):
            return done("refused", reason=exc.what, **base)
        if stage == "identity" and isinstance(exc, AssertionError):
            return done("wrong", reason=f"identity: {exc}", **base)
        if isinstance(exc, NotApplicable):  # transformers' own cached generate fails on this tiny model
            return done("not-built", reason=str(exc)[:200], **base)
        return done("crash", reason=f"{stage}: {_short(exc)}", **base)
    return done("exact", max_logit_diff=res.max_logit_diff, reason=left_out, **base)


def all_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def run(types=None, *, host=None, progress=None) -> list[Result]:
    out = []
    for mt in types or all_types():
        out.append(run_type(mt, host=host))
        if progress:
            progress(out[-1])
    return out
