"""The generic adapter: any decoder model transformers can build, read from its own config class.

Used when no family file claims a ``model_type``. ``describe`` instantiates the transformers
config class of the model type (so every default, legacy key and derived field is exactly
what the model will see), takes the decoder text config of multimodal wrappers
(``get_text_config``; the wrapper's dtype wins), and reads the cache layout the way
``DynamicCache(config=...)`` does (``transformers.cache_utils.get_layer_types_and_kwargs``):
per layer full / sliding / chunked attention, recurrent or convolution state, or no KV of its
own (shared KV, MLP-only layers). Heads and head sizes come from the per-layer config views;
RoPE from ``rope_parameters`` (flat, or nested per layer type); NoPE layers from
``no_rope_layers`` and the few families listed in :mod:`kvbridge.builtin.families._generic_facts`.

What the config cannot say (the rotation convention of a family, which layer kinds skip RoPE)
is in that facts table, each entry verified by ``kvbridge conformance`` against the model's own
cache. A model whose cache kvbridge cannot represent is refused with the reason.

Describing through this adapter imports transformers (and torch); the family files stay
torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, replace as _replace
from typing import Any, Mapping

from kvbridge.family_adapter import FamilyAdapter
from kvbridge.builtin.families import _generic_facts as facts
from kvbridge.builtin.families._common import dtype_name, layer_attr as _layer_attr, rope_spec
from kvbridge.spec import CHUNKED, CONV, FULL, LINEAR, NO_ATTENTION, SHARED, SLIDING, ModelSpec, freeze
from kvbridge.errors import ConfigError, UnsupportedModelError

#: transformers cache layer type -> (kvbridge layer kind, holds recurrent/conv state)
HF_LAYER_KINDS = {
    "full_attention": (FULL, False),
    "sliding_attention": (SLIDING, False),
    "chunked_attention": (CHUNKED, False),
    "linear_attention": (LINEAR, True),
    "conv": (CONV, True),
    "hybrid": (FULL, True),
    "hybrid_sliding": (SLIDING, True),
    "indexed_attention": (FULL, False),  # sparse attention: K/V of every token + indexer keys (see facts.indexer)
}


def hf_configs(config: Mapping) -> tuple[Any, Any]:
    """(the transformers config object, its decoder text config) of a config mapping."""
    from kvbridge.models.hf_loader import config_for_model

    data = {k: v for k, v in dict(config).items() if k not in ("transformers_version", "architectures")}
    model_type = data.pop("model_type")
    try:
        obj = config_for_model(model_type, **data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ConfigError(
            f"transformers cannot read this {model_type!r} config: {type(exc).__name__}: {exc}",
            "compare the config with the model's published config.json",
        ) from None
    return obj, obj.get_text_config(decoder=True)


def _refused(model_type: str, why: str) -> UnsupportedModelError:
    """The one-line refusal of a model whose cache kvbridge cannot represent, with ``why``."""
    return UnsupportedModelError(f"model type {model_type!r}: {why}", facts.REFUSED_FIX)


def _rope_tables(
    text,
    head_dim: int,
    max_positions: int,
    interleaved: bool,
    head_dims: Mapping | None = None,
    partial_of: int | None = None,
):
    """(main table, per-layer-type tables) from ``rope_parameters`` (flat or nested); a nested
    table is sized to the head dim of its layer kind (``head_dims``). ``partial_of``: the head dim a
    configured partial factor refers to when the table's own width differs (MLA: the factor is of the
    query head, the table rotates the cached RoPE key)."""
    params = getattr(text, "rope_parameters", None) or {}
    partial_attr = getattr(text, "partial_rotary_factor", None)

    def one(p: Mapping, head_dim: int = head_dim):
        p = {"rope_type": "default", **p}
        if p.get("rope_theta") is None:
            p["rope_theta"] = getattr(text, "rope_theta", None) or 10000.0
        partial = p.get("partial_rotary_factor", partial_attr) or 1.0
        if partial_of and partial != 1.0:  # rotated dims = partial x partial_of, as a share of this table
            partial = min(1.0, int(partial_of * partial) / head_dim)
        if p["rope_type"] == "proportional":  # whole-head pairing, zero frequencies past the proportion
            p["rope_proportion"], partial = float(partial), 1.0
        return rope_spec(
            p,
            head_dim=head_dim,
            partial_factor=float(partial),
            interleaved=interleaved,
            max_position_embeddings=max_positions,
        )

    if params and all(isinstance(v, Mapping) for v in params.values()):  # nested per layer type
        tables = {}
        for hf_type, p in params.items():  # keyed by kvbridge's layer kind (indexed_attention: a full layer)
            kind = HF_LAYER_KINDS.get(hf_type, (hf_type,))[0]
            tables.setdefault(kind, one(p, (head_dims or {}).get(kind) or head_dim))
        main = tables.get(FULL) or next(iter(tables.values()))
        return main, tuple(sorted(tables.items())) if len(tables) > 1 else ()
    return one(params), ()


@dataclass(frozen=True)
class GenericAdapter(FamilyAdapter):
    """Decoder models described from transformers' own config class (no family file)."""

    name: str = "generic"
    model_types: tuple = ()
    description: str = "any transformers decoder without a family file: read from its config class"

    def supports(self, model_type: str) -> bool:
        # a type transformers has a config class for (imports transformers): the causal-LM registry
        # plus the text configs some of its classes take (``emu3_text_model`` ...)
        try:
            from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        except Exception:  # pragma: no cover - transformers missing or broken
            return False
        return model_type in CONFIG_MAPPING_NAMES

    def describe(self, config: Mapping) -> ModelSpec:
        from transformers.cache_utils import get_layer_types_and_kwargs

        config = dict(config)
        model_type = str(config.get("model_type"))
        refusal = facts.REFUSED.get(model_type)
        if refusal:
            raise _refused(model_type, refusal)
        obj, text = hf_configs(config)
        try:
            hf_types, kwargs = get_layer_types_and_kwargs(text)
        except Exception as exc:
            why = f"transformers gives no per-layer cache layout ({type(exc).__name__}: {exc})"
            raise _refused(model_type, why) from None
        slots = facts.cache_slots(text, len(hf_types))  # cache layer -> model layer
        hf_types, kwargs = [list(hf_types)[s] for s in slots], [list(kwargs)[s] for s in slots]
        sharing = list(getattr(text, "kv_sharing_modes", None) or [])
        kinds, state_layers, shared, no_kv = [], [], [], []
        indexed = [i for i, t in enumerate(hf_types) if t == "indexed_attention"]
        try:
            indexer = facts.indexer(model_type, text, indexed) if indexed else {}
        except ValueError as exc:
            raise _refused(model_type, f"layer {indexed[0]} is a 'indexed_attention' layer: {exc}") from None
        for i, t in enumerate(hf_types):
            if t == "dummy":
                reused = i < len(sharing) and sharing[i] == "reuse"
                kinds.append(SHARED if reused else NO_ATTENTION)
                (shared if reused else no_kv).append(i)
                continue
            if t not in HF_LAYER_KINDS:
                why = facts.LAYER_REFUSALS.get(t, "a cache layer kind kvbridge cannot read")
                raise _refused(model_type, f"layer {i} is a {t!r} layer: {why}")
            kind, has_state = HF_LAYER_KINDS[t]
            kinds.append(kind)
            if has_state:
                state_layers.append(i)
                if kind in (LINEAR, CONV):
                    no_kv.append(i)
        windows = {
            kw.get("sliding_window") for t, kw in zip(hf_types, kwargs) if t in ("sliding_attention", "hybrid_sliding")
        }
        chunks = {kw.get("sliding_window") for t, kw in zip(hf_types, kwargs) if t == "chunked_attention"}
        if len(windows) > 1 or len(chunks) > 1:
            raise _refused(model_type, f"sliding layers use different windows ({sorted(windows | chunks)})")

        heads = int(getattr(text, "decoder_attention_heads", None) or text.num_attention_heads)
        hidden = int(getattr(text, "hidden_size"))
        per_layer = text.per_layer_config
        kv_heads, k_dims = [], []
        for i, kind in enumerate(kinds):
            if i in no_kv or i in shared:
                kv_heads.append(0)
                k_dims.append(0)
                continue
            lc = per_layer[slots[i]]
            h = int(_layer_attr(lc, "decoder_attention_heads", None) or _layer_attr(lc, "num_attention_heads", heads))
            kv_heads.append(facts.cached_kv_heads(model_type, lc, h, kind == SLIDING))
            k_dims.append(facts.key_head_dim(lc, h, hidden, kind == SLIDING))
        present = [(kv, hd) for kv, hd in zip(kv_heads, k_dims) if kv]
        if not present:
            raise UnsupportedModelError(
                f"model type {model_type!r} has no attention KV cache (recurrent/state-space model)",
                "kvbridge moves attention KV caches; choose a transformer model",
            )
        main_kv, main_hd = present[0]
        uniform = all(p == (main_kv, main_hd) for p in present)
        for i, kv in enumerate(kv_heads):
            if kv and heads % kv:
                raise ConfigError(
                    f"{kv} KV heads do not divide {heads} attention heads (layer {i})",
                    "fix 'num_key_value_heads'",
                )

        mla = facts.mla_sizes(text)
        # MLA caches (latent [B, 1, T, kv_lora_rank], RoPE key [B, 1, T, qk_rope_head_dim]) in the K/V slots
        value_dim = mla.get("qk_rope_head_dim") if mla else _layer_attr(text, "v_head_dim", None)
        max_positions = int(
            _layer_attr(text, "max_position_embeddings", 0) or _layer_attr(text, "n_positions", 0) or 2048
        )
        positional = facts.positional(model_type, text)
        rope, by_type, nope = None, (), ()
        if positional == "rope":
            rope_dim = mla.get("qk_rope_head_dim") if mla else None
            # MLA: the table rotates the whole cached RoPE key (the values slot)
            by_kind = {kind: hd for kind, hd in reversed(list(zip(kinds, k_dims))) if hd}  # the first layer's wins
            rope, by_type = _rope_tables(
                text,
                rope_dim or main_hd,
                max_positions,
                facts.interleaved(model_type, text),
                None if rope_dim else by_kind,
                partial_of=_layer_attr(text, "head_dim", None) if rope_dim else None,
            )
            if model_type in facts.NEGATIVE_ROTATION:
                flip = lambda r: _replace(r, scaling=freeze({**r.params, "direction": -1}))  # noqa: E731
                rope, by_type = flip(rope), tuple((k, flip(v)) for k, v in by_type)
            nope = facts.nope_layers(model_type, text, kinds)
            if len(nope) == sum(1 for k in kinds if k in (FULL, SLIDING, CHUNKED)):
                positional, rope, by_type, nope = "none", None, (), ()
        return ModelSpec(
            model_type=(getattr(text, "model_type", model_type) or model_type) if text is not obj else model_type,
            family=self.name,
            num_layers=len(kinds),
            num_attention_heads=heads,
            num_kv_heads=main_kv,
            head_dim=main_hd,
            hidden_size=hidden,
            positional=positional,
            rope=rope,
            rope_by_layer_type=by_type,
            sliding_window=next(iter(windows), None),
            layer_types=tuple(kinds),
            qk_norm=bool(getattr(text, "use_qk_norm", False) or getattr(text, "qk_layernorm", False)),
            dtype=dtype_name(config)
            if (config.get("dtype") or config.get("torch_dtype"))
            else str(getattr(text, "dtype", None) or "float32").removeprefix("torch."),
            vocab_size=int(getattr(text, "vocab_size", 0) or 0),
            max_position_embeddings=max_positions,
            extras=freeze({"config_class": type(text).__name__} | ({} if text is obj else {"wrapper": model_type})),
            nope_layers=tuple(nope),
            attention_chunk_size=next(iter(chunks), None),
            layer_kv_heads=() if uniform else tuple(kv_heads),
            layer_head_dims=() if uniform else tuple(k_dims),
            value_head_dim=value_dim if value_dim and value_dim != main_hd else None,
            kv_shared_layers=tuple(shared),
            no_kv_layers=tuple(no_kv),
            state_layers=tuple(state_layers),
            cache_format="mla" if mla else ("hybrid" if state_layers else "kv"),
            latent=freeze(mla),
            indexer_layers=tuple(indexer.pop("layers", ())),
            indexer=freeze(indexer),
        )

    # -- model side -------------------------------------------------------------------------
    def hf_config(self, config: Mapping):
        return hf_configs(config)[0]

    def extract(self, model, input_ids, attention_mask=None, *, spec: ModelSpec | None = None):
        from kvbridge.builtin.families import hf_cache

        return hf_cache.extract(self, model, input_ids, attention_mask, spec=spec or self.spec_of(model))

    def inject(self, state, model=None, *, check: bool = True):
        from kvbridge.builtin.families import hf_cache

        return hf_cache.inject(self, state, model, check=check)


ADAPTER = GenericAdapter()
