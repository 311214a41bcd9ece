"""Reading and building transformers caches layer by layer (generic adapter, model side).

The cache is laid out as ``DynamicCache(config=model.config)`` lays it out (per layer: K/V,
recurrent/convolution state, or nothing for shared-KV and MLP-only layers), except that
sliding and chunked layers keep their full history while extracting (``DynamicLayer``); on
injection attention layers are plain ``DynamicLayer``\\ s holding the whole history, which the
models mask by position exactly as their own windowed layers would.
"""

from __future__ import annotations

import sys

from kvbridge.errors import StateError

#: the fix of a cache that does not hold what the spec says
_FIX_DESCRIBE = "check the adapter's describe() for this model"

#: a linear-attention cache layer's bookkeeping (per-layer dicts), copied with its states
_STATE_FLAGS = "has_previous_state conv_kernel_size is_conv_states_initialized is_recurrent_states_initialized".split()


def _layers_for(model, *, full_history: bool):
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, get_layer_types_and_kwargs

    types, kwargs = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    layers = []
    for t, kw in zip(types, kwargs):
        if full_history and t in ("sliding_attention", "chunked_attention"):  # a plain full layer: every token kept
            t, kw = "full_attention", {}
        elif full_history and t == "hybrid_sliding":
            t, kw = "hybrid", {k: v for k, v in kw.items() if k != "sliding_window"}
        layers.append(DYNAMIC_LAYER_TYPE_MAPPING[t](**kw))
    return layers


def _own_cache(model):
    """(cache class, state attribute) of a family whose model builds its own cache, or None."""
    from kvbridge.builtin.families._generic_facts import OWN_CACHE

    entry = OWN_CACHE.get(getattr(model.config.get_text_config(decoder=True), "model_type", None))
    return None if entry is None else (getattr(sys.modules[type(model).__module__], entry[0]), entry[1])


def reference_cache(model):
    """The cache ``generate`` itself would use: ``DynamicCache(config=...)``, or the family's own."""
    from transformers import DynamicCache

    own = _own_cache(model)
    return own[0]() if own else DynamicCache(config=model.config)


def new_cache(model, *, full_history: bool = True, filled: bool = False):
    """An empty cache laid out for ``model``; ``filled``: about to be filled by injection (a family's
    own cache class then gets every layer and an empty state slot per layer up front)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    own = _own_cache(model)
    if own is not None:  # its own class: plain layers (added as the model runs), state beside them
        cache = own[0]()
        if filled:
            n = model.config.get_text_config(decoder=True).num_hidden_layers
            cache.layers = [DynamicLayer() for _ in range(n)]
            setattr(cache, own[1], [[] for _ in range(n)])
        return cache
    cache = DynamicCache()
    cache.layers = _layers_for(model, full_history=full_history)
    return cache


def _side_state(cache, model, i: int) -> dict | None:
    """Recurrent state a family's own cache keeps beside its layers (MiniMax), cloned, or None."""
    own = _own_cache(model)
    held = getattr(cache, own[1], None) if own else None
    t = held[i] if held is not None and i < len(held) else None
    return {own[1]: t.detach().clone()} if hasattr(t, "detach") else None


def _states_of(layer) -> dict | None:
    """Recurrent / convolution state of a linear-attention cache layer (cloned), or None."""
    if not hasattr(layer, "recurrent_states"):
        return None
    out = {}
    for name in ("conv_states", "recurrent_states"):
        for idx, t in getattr(layer, name).items():
            out[f"{name}.{idx}"] = None if t is None else t.detach().clone()
    return out | {name: dict(getattr(layer, name)) for name in _STATE_FLAGS}


def _indexer_keys_of(layer, i: int, spec, positions):
    """The indexer keys of a sparse-attention cache layer (cloned). A position history kept beside
    them (Qwen4-Exp) must be the token positions on each row: it is rebuilt from them on injection."""
    t = getattr(layer, "indexer_keys", None)
    if t is None or t.dim() != 3:
        raise StateError(f"layer {i} of the model's cache holds no indexer keys, spec says it does", _FIX_DESCRIBE)
    pos = getattr(layer, "indexer_position_ids", None)
    if pos is not None:
        rows = int(dict(spec.indexer).get("position_rows", 0))
        if not rows or tuple(pos.shape) != (rows, *positions.shape) or not bool((pos == positions[None]).all()):
            raise StateError(
                f"layer {i} of the model's cache holds an indexer position history that is not the "
                "token positions (multimodal positions?), which kvbridge does not carry",
                "extract from text-only input ids",
            )
    return t.detach().clone()


def _indexer_positions(state):
    """The position history a raw-key indexer (Qwen4-Exp) keeps on its first indexed layer."""
    rows = int(dict(state.spec.indexer).get("position_rows", 0))
    return state.positions[None].expand(rows, *state.positions.shape).clone() if rows and state.indexer_keys else None


def extract(adapter, model, input_ids, attention_mask=None, *, spec):
    import torch

    from kvbridge.family_adapter import prefill, prefill_state

    ids, positions, out, cache = prefill(model, input_ids, attention_mask, lambda: new_cache(model, full_history=True))
    cache = getattr(out, "cache", None) or cache
    layers = list(cache.layers)
    if _own_cache(model) is not None:  # its own class adds layers only up to the last attention layer
        layers += [None] * (len(cache) - len(layers))
    if len(layers) != spec.num_layers:
        raise StateError(
            f"model returned a cache with {len(layers)} layers, spec says {spec.num_layers}", _FIX_DESCRIBE
        )
    B, T = ids.shape
    keys, values, states, indexer = [], [], [], []
    dtype = next(model.parameters()).dtype
    for i, layer in enumerate(layers):
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if i in spec.kv_layers:
            if k is None or k.dim() != 4:
                raise StateError(f"layer {i} of the model's cache holds no K/V, spec says it does", _FIX_DESCRIBE)
        else:  # no K/V of its own: [B, 0, T, 0]
            k = v = torch.zeros(B, 0, T, 0, dtype=dtype, device=ids.device)
        keys.append(k.detach().clone())
        values.append(v.detach().clone())
        st = _states_of(layer)
        st = st if st is not None or i not in spec.state_layers else _side_state(cache, model, i)
        if st is not None:
            states.append((i, st))
        if i in spec.indexer_layers:
            indexer.append((i, _indexer_keys_of(layer, i, spec, positions)))
    return prefill_state(
        adapter, model, spec, ids, positions, keys, values, states=tuple(states), indexer_keys=tuple(indexer)
    )


def inject(adapter, state, model=None, *, check: bool = True):
    adapter.check_injectable(state, model, check=check)
    if state.spec.state_layers and not state.states:
        raise StateError(
            "the state has no recurrent/convolution state for the model's recurrent layers",
            "extract the state from a model of this family (recurrent state cannot be mapped)",
        )
    if model is None:
        raise StateError("the generic adapter needs the model to build its cache", "pass model=")
    if state.spec.indexer_layers and not state.indexer_keys:
        raise StateError(
            f"the state has no indexer keys for the model's sparse-attention layers {list(state.spec.indexer_layers)}",
            "extract the state from this model (indexer keys cannot be mapped across models)",
        )
    cache = new_cache(model, full_history=True, filled=True)
    from transformers.cache_utils import DynamicLayer

    # cache layers past the model's own (Dory's per-loop copies, which its forward appends when absent)
    cache.layers += [DynamicLayer() for _ in range(state.spec.num_layers - len(cache.layers))]
    by_layer = dict(state.states)
    indexer = dict(state.indexer_keys)
    for i, layer in enumerate(cache.layers):
        if i in state.spec.kv_layers:
            layer.update(state.keys[i].detach().clone(), state.values[i].detach().clone())
        if i in indexer:
            layer.update_indexer(indexer[i].detach().clone())
            if i == state.spec.indexer_layers[0]:
                layer.indexer_position_ids = _indexer_positions(state)
        st = by_layer.get(i)
        own = _own_cache(model)
        if st is not None and own is not None and own[1] in st:
            getattr(cache, "set_" + own[1])(i, st[own[1]].detach().clone())  # MiniMaxCache.set_linear_cache
        elif st is not None:
            for key, value in st.items():
                if "." in key:
                    name, idx = key.split(".")
                    getattr(layer, name)[int(idx)] = None if value is None else value.detach().clone()
                else:
                    getattr(layer, key).update(value)
            tensors = [t for k, t in st.items() if "." in k and t is not None]
            if tensors:
                layer.device, layer.dtype = tensors[0].device, tensors[0].dtype
            layer.is_initialized = True
    return cache
