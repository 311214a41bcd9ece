"""FamilyAdapter: how one model family's configs, caches and models look to kvbridge.

The base class implements the Hugging Face defaults (``DynamicCache`` layout, keys stored
after RoPE, ``config.rope_parameters``); a family file under ``kvbridge/builtin/families/``
subclasses it and overrides ``describe`` (config mapping -> ModelSpec) and whatever else
differs. Torch and transformers are imported inside the methods, never at import time.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from kvbridge.errors import ConfigError, StateError
from kvbridge.plugins import memo_on_model
from kvbridge.spec import ModelSpec

# the fingerprints live in kvbridge.models.fingerprint; these names are kept for callers
from kvbridge.models.fingerprint import config_fingerprint, weights_fingerprint  # noqa: F401

if TYPE_CHECKING:  # pragma: no cover
    from kvbridge.kvstate import KVState


def require(config: Mapping, *names: str, where: str = "config") -> Any:
    """The first of ``names`` present in ``config``, or a one-line ConfigError naming them."""
    for name in names:
        if name in config and config[name] is not None:
            return config[name]
    raise ConfigError(
        f"{where} is missing {' or '.join(repr(n) for n in names)}",
        f"add {names[0]!r} to the config (model_type {config.get('model_type')!r})",
    )


def positive_int(config: Mapping, *names: str, where: str = "config") -> int:
    value = require(config, *names, where=where)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"{where} field {names[0]!r} must be a positive integer, got {value!r}", f"fix {names[0]!r} in the config"
        )
    return value


def prefill(model, input_ids, attention_mask, make_cache) -> tuple:
    """``(ids [B, T], positions [B, T], output, cache)``: ``input_ids`` prefilled once into ``make_cache()``
    (a cache that keeps every layer's whole history). Positions follow a left-padding mask, as generate's do."""
    import torch

    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.shape[1] == 0:
        raise StateError("cannot extract a cache from an empty token sequence", "pass at least one token id")
    cache = make_cache()
    kwargs: dict = {"cache": cache, "use_cache": True}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1  # only the cache is wanted: skip the [B, T, vocab] logits
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    with torch.no_grad():
        out = model(input_ids=ids, **kwargs)
    positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape).clone()
    if attention_mask is not None:
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return ids, positions, out, cache


def prefill_state(adapter, model, spec: ModelSpec, ids, positions, keys, values, **parts) -> "KVState":
    """The KVState of a :func:`prefill`: ``keys`` / ``values`` per layer (``parts``: recurrent states,
    indexer keys), the RoPE lengths the adapter reads from the model, the config's fingerprint."""
    from kvbridge.kvstate import KVState

    return KVState(
        keys=tuple(keys),
        values=tuple(values),
        token_ids=ids.clone(),
        positions=positions,
        spec=spec,
        rope_applied=spec.positional == "rope",
        rope_lengths=adapter._rope_lengths(model, spec, positions),
        model_fingerprint=config_fingerprint(model.config.to_dict()),
        **parts,
    )


@dataclass(frozen=True)
class FamilyAdapter:
    """Base adapter. Subclasses set ``name``/``model_types`` and implement ``describe``."""

    name: str = ""
    model_types: tuple = ()
    description: str = ""

    # -- config side (no torch) ---------------------------------------------------------
    def describe(self, config: Mapping) -> ModelSpec:  # pragma: no cover - abstract
        raise NotImplementedError

    def tiny_config(self) -> dict:
        """A small but complete config of this family, for tests and the contract suite."""
        raise NotImplementedError(f"adapter {self.name!r} has no tiny_config()")

    # -- model side ----------------------------------------------------------------------
    def hf_config(self, config: Mapping):
        """A transformers config object from a config mapping."""
        from kvbridge.models.hf_loader import config_for_model

        data = dict(config)
        return config_for_model(data.pop("model_type"), **data)

    def build_model(self, config: Mapping, *, seed: int = 0, dtype: str = "float32"):
        """A randomly initialised model of this family (tests; no download)."""
        import torch
        from kvbridge.models.hf_loader import model_from_config

        torch.manual_seed(seed)
        return model_from_config(self.hf_config(config), dtype=getattr(torch, dtype)).eval()

    def spec_of(self, model) -> ModelSpec:
        """The spec of a live model (from its config, dtype from its parameters); memoised on the
        model, keyed by this adapter, the config's attributes and the parameters' dtype."""
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        describe = lambda: self.describe(model.config.to_dict()).with_dtype(dtype)  # noqa: E731
        return memo_on_model(model, "_kvbridge_spec", describe, self, dtype)

    def rotary_embedding(self, model, layer: int = 0):
        """The model's rotary module (for tests against its own tables)."""
        return getattr(getattr(model, model.base_model_prefix, model), "rotary_emb", None)

    def extract(self, model, input_ids, attention_mask=None, *, spec: ModelSpec | None = None) -> "KVState":
        """Prefill ``input_ids`` once and return the cache as a KVState (full history kept)."""
        from transformers import DynamicCache

        spec = spec or self.spec_of(model)
        ids, positions, out, cache = prefill(model, input_ids, attention_mask, DynamicCache)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None) or cache
        keys, values = self._cache_tensors(cache, spec)
        return prefill_state(self, model, spec, ids, positions, keys, values)

    def _rope_lengths(self, model, spec: ModelSpec, positions):
        """Per-key forward length that picked each key's RoPE table (stateful types only).

        ``longrope`` picks its factors from this forward's length. ``dynamic`` modules are
        sticky: after a longer forward they keep the longer table, so the length actually
        used is read back from the module (``max_seq_len_cached``) after the forward.
        """
        import torch

        from kvbridge import rope as rope_codec

        if not (spec.rope and spec.rope.is_stateful):
            return None
        lengths = rope_codec.forward_lengths(positions)
        if spec.rope.rope_type == "dynamic":
            used = getattr(self.rotary_embedding(model), "max_seq_len_cached", None)
            if used is not None:
                lengths = torch.full_like(lengths, int(used))
        return lengths

    def _cache_tensors(self, cache, spec: ModelSpec) -> tuple[tuple, tuple]:
        layers = list(getattr(cache, "layers", []))
        if len(layers) != spec.num_layers:
            raise StateError(
                f"model returned a cache with {len(layers)} layers, spec says {spec.num_layers}",
                "check the family adapter's describe() for this model",
            )
        return tuple(la.keys.detach().clone() for la in layers), tuple(la.values.detach().clone() for la in layers)

    def check_injectable(self, state: "KVState", model=None, *, check: bool = True) -> None:
        """Refuse a state :meth:`inject` cannot use: with ``check``, one that does not fit ``model``'s spec
        and dtype (without a model: its own spec); always, keys in content space (RoPE stripped)."""
        if check:
            import torch

            spec = self.spec_of(model) if model is not None else state.spec
            state.validate(spec, dtype=getattr(torch, spec.dtype) if model is not None else None)
        if not state.rope_applied and state.spec.positional == "rope":
            raise StateError(
                "state keys are in content space (RoPE stripped)", "call state.apply_rope() before injecting"
            )

    def inject(self, state: "KVState", model=None, *, check: bool = True):
        """A fresh ``DynamicCache`` holding ``state`` (cloned: never aliases the caller's tensors)."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        self.check_injectable(state, model, check=check)
        # ``update`` concatenates into new tensors: the cache never aliases the state's
        data = [(k.detach(), v.detach()) for k, v in zip(state.keys, state.values)]
        if model is not None:
            # the model's own layer layout (sliding-window layers keep their window, as in its own
            # cache): the continuation then attends over the same keys as the model's own cache does
            cache = _empty_cache(model)
            if len(cache.layers) == len(data):
                for layer, (k, v) in zip(cache.layers, data):
                    if type(layer) is DynamicLayer:  # a full layer's update is a copy of what it is given
                        layer.lazy_initialization(k, v)
                        layer.keys, layer.values = k.clone(), v.clone()
                    else:  # sliding layers keep their window: the layer's own rule
                        layer.update(k, v)
                return cache
        return DynamicCache(data)


def _empty_cache(model):
    """A fresh, empty ``DynamicCache`` in the model's own layer layout. Reading the layout from the
    config is the costly part of a small restore, so an empty template is kept on the model (keyed by
    the config's attributes) and copied: an empty layer holds no tensors, so where every attribute of
    the template and its layers is an immutable scalar a new object with the same attributes is an
    exact copy (a deep copy otherwise)."""
    import copy

    from transformers import DynamicCache

    def make() -> tuple:
        template = DynamicCache(config=model.config)
        return template, _scalars_only(template, skip="layers") and all(_scalars_only(la) for la in template.layers)

    template, flat = memo_on_model(model, "_kvbridge_empty_cache", make)
    if not flat:
        return copy.deepcopy(template)
    cache = _same_attributes(template)
    cache.layers = [_same_attributes(layer) for layer in template.layers]
    return cache


_SCALARS = (type(None), bool, int, float, str)


def _scalars_only(obj, skip: str | None = None) -> bool:
    attrs = getattr(obj, "__dict__", None)
    if attrs is None or any(k.__dict__.get("__slots__") for k in type(obj).__mro__):  # slots: not in vars()
        return False
    return all(type(v) in _SCALARS or type(v) is type for k, v in attrs.items() if k != skip)


def _same_attributes(obj):
    out = object.__new__(type(obj))
    out.__dict__.update(vars(obj))
    return out


def text_config_of(config: Mapping) -> dict | None:
    """The decoder config inside a multimodal wrapper (``text_config``), the wrapper's dtype kept.

    None when ``config`` has no ``text_config`` with a ``model_type``. The wrapper's ``dtype``
    (or legacy ``torch_dtype``) is the dtype the checkpoint is loaded in, so it wins over the
    text config's own (often absent, i.e. float32) dtype.
    """
    text = config.get("text_config") if isinstance(config, Mapping) else None
    if not (isinstance(text, Mapping) and text.get("model_type")):
        return None
    out = dict(text)
    dtype = config.get("dtype") or config.get("torch_dtype")
    if dtype is not None:
        out["dtype"] = str(dtype).removeprefix("torch.")
        out.pop("torch_dtype", None)
    return out


@dataclass(frozen=True)
class TextConfigAdapter(FamilyAdapter):
    """A family adapter applied to the ``text_config`` of a multimodal wrapper (Gemma 3 ...).

    ``describe`` reads the wrapper's text config (wrapper dtype kept); the model side is the
    inner adapter's: the wrapper model's cache is its text decoder's.
    """

    inner: Any = None
    wrapper_type: str = ""

    def describe(self, config: Mapping) -> ModelSpec:
        text = text_config_of(config)
        return self.inner.describe(text if text is not None else config)

    def extract(self, model, input_ids, attention_mask=None, *, spec: ModelSpec | None = None):
        return self.inner.extract(model, input_ids, attention_mask, spec=spec or self.spec_of(model))

    def inject(self, state, model=None, *, check: bool = True):
        if check and model is not None:
            self.check_injectable(state, model)
        return self.inner.inject(state, model, check=False)

    def rotary_embedding(self, model, layer: int = 0):
        text = model.get_decoder() if hasattr(model, "get_decoder") else model
        return getattr(text, "rotary_emb", None) or self.inner.rotary_embedding(model, layer)
