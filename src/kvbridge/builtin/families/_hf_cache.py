"""Reading and building transformers caches layer by layer (generic adapter, model side).

The cache is laid out as ``DynamicCache(config=model.config)`` lays it out (per layer: K/V,
recurrent/convolution state, or nothing for shared-KV and MLP-only layers), except that
sliding and chunked layers keep their full history while extracting (``DynamicLayer``); on
injection attention layers are plain ``DynamicLayer``\\ s holding the whole history, which the
models mask by position exactly as their own windowed layers would.
"""

from __future__ import annotations

import inspect

from kvbridge.errors import StateError


def _layers_for(model, *, full_history: bool):
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, DynamicLayer, get_layer_types_and_kwargs

    text = model.config.get_text_config(decoder=True)
    types, kwargs = get_layer_types_and_kwargs(text)
    layers = []
    for t, kw in zip(types, kwargs):
        if full_history and t in ("sliding_attention", "chunked_attention"):
            layers.append(DynamicLayer())
        elif full_history and t == "hybrid_sliding":
            kw = {k: v for k, v in kw.items() if k != "sliding_window"}
            layers.append(DYNAMIC_LAYER_TYPE_MAPPING["hybrid"](**kw))
        else:
            layers.append(DYNAMIC_LAYER_TYPE_MAPPING[t](**kw))
    return layers


def new_cache(model, *, full_history: bool = True):
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = _layers_for(model, full_history=full_history)
    return cache


def _states_of(layer) -> dict | None:
    """Recurrent / convolution state of a linear-attention cache layer (cloned), or None."""
    if not hasattr(layer, "recurrent_states"):
        return None
    out = {}
    for name in ("conv_states", "recurrent_states"):
        for idx, t in getattr(layer, name).items():
            out[f"{name}.{idx}"] = None if t is None else t.detach().clone()
    for name in ("has_previous_state", "conv_kernel_size", "is_conv_states_initialized",
                 "is_recurrent_states_initialized"):
        out[name] = dict(getattr(layer, name))
    return out


def extract(adapter, model, input_ids, attention_mask=None, *, spec):
    import torch

    from kvbridge.adapter import config_fingerprint
    from kvbridge.kvstate import KVState

    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.shape[1] == 0:
        raise StateError("cannot extract a cache from an empty token sequence", "pass at least one token id")
    cache = new_cache(model, full_history=True)
    kwargs: dict = {"cache": cache, "use_cache": True}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    with torch.no_grad():
        out = model(input_ids=ids, **kwargs)
    cache = getattr(out, "cache", None) or cache
    if len(cache.layers) != spec.num_layers:
        raise StateError(f"model returned a cache with {len(cache.layers)} layers, spec says {spec.num_layers}",
                         "check the adapter's describe() for this model")
    B, T = ids.shape
    keys, values, states = [], [], []
    dtype = next(model.parameters()).dtype
    for i, layer in enumerate(cache.layers):
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if i in spec.kv_layers:
            if k is None or k.dim() != 4:
                raise StateError(f"layer {i} of the model's cache holds no K/V, spec says it does",
                                 "check the adapter's describe() for this model")
            keys.append(k.detach().clone())
            values.append(v.detach().clone())
        else:
            keys.append(torch.zeros(B, 0, T, 0, dtype=dtype, device=ids.device))
            values.append(torch.zeros(B, 0, T, 0, dtype=dtype, device=ids.device))
        st = _states_of(layer)
        if st is not None:
            states.append((i, st))
    positions = torch.arange(T, device=ids.device).expand(B, T).clone()
    if attention_mask is not None:
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    lengths = adapter._rope_lengths(model, spec, positions)
    return KVState(keys=tuple(keys), values=tuple(values), token_ids=ids.clone(), positions=positions, spec=spec,
                   rope_applied=spec.positional == "rope", rope_lengths=lengths,
                   model_fingerprint=config_fingerprint(model.config.to_dict()), states=tuple(states))


def inject(adapter, state, model=None, *, check: bool = True):
    import torch

    if check:
        spec = adapter.spec_of(model) if model is not None else state.spec
        state.validate(spec, dtype=getattr(torch, spec.dtype) if model is not None else None)
    if not state.rope_applied and state.spec.positional == "rope":
        raise StateError("state keys are in content space (RoPE stripped)", "call state.apply_rope() before injecting")
    if state.spec.state_layers and not state.states:
        raise StateError("the state has no recurrent/convolution state for the model's recurrent layers",
                         "extract the state from a model of this family (recurrent state cannot be mapped)")
    if model is None:
        raise StateError("the generic adapter needs the model to build its cache", "pass model=")
    cache = new_cache(model, full_history=True)
    from transformers.cache_utils import DynamicLayer

    # cache layers past the model's own (Dory's per-loop copies, which its forward appends when absent)
    cache.layers += [DynamicLayer() for _ in range(state.spec.num_layers - len(cache.layers))]
    by_layer = dict(state.states)
    for i, layer in enumerate(cache.layers):
        if i in state.spec.kv_layers:
            layer.update(state.keys[i].detach().clone(), state.values[i].detach().clone())
        st = by_layer.get(i)
        if st is not None:
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
