"""ModelSpec and RopeSpec: a model's KV geometry, read from its config alone (no torch).

A :class:`ModelSpec` says what a model's attention cache looks like (layers, KV heads as
stored in the cache, head dim), how positions enter it (RoPE and its parameters, absolute
embeddings, ALiBi) and which layers are sliding-window. Family adapters build them from a
config mapping (the parsed ``config.json`` or ``PretrainedConfig.to_dict()``); see
:mod:`kvbridge.builtin.families`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

POSITIONAL_KINDS = ("rope", "absolute", "alibi", "none")
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
FULL = "full_attention"
SLIDING = "sliding_attention"
#: attention over fixed chunks (Llama 4): the cache keeps the current chunk
CHUNKED = "chunked_attention"
#: layer kinds without a per-token KV cache of their own
LINEAR = "linear_attention"  # recurrent state (gated delta net, Mamba in a hybrid stack ...)
CONV = "conv"  # short convolution state (LFM2)
SHARED = "shared_kv"  # reuses an earlier layer's KV (Gemma 3n, Gemma 4)
NO_ATTENTION = "no_attention"  # MLP / MoE-only layer
#: cache formats (ModelSpec.cache_format)
CACHE_FORMATS = ("kv", "mla", "hybrid")


def freeze(value: Any) -> Any:
    """Turn lists/dicts into tuples so a spec stays hashable and frozen."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        if value and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in value):
            return {k: _thaw(v) for k, v in value}
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class RopeSpec:
    """How rotary position embeddings are applied to one model's keys."""

    rope_type: str = "default"  # one of ROPE_TYPES (or a plugin's variant name)
    theta: float = 10000.0  # base of the inverse frequencies
    head_dim: int = 64  # full head dim of the keys
    partial_factor: float = 1.0  # share of head_dim that rotates (Phi 0.4/0.5, NeoX 0.25)
    interleaved: bool = False  # GPT-J/CodeGen/Cohere pairs (2i, 2i+1); False = half split
    max_position_embeddings: int = 2048  # the model's max positions (dynamic/yarn/longrope use it)
    # extra parameters of the rope type (factor, low_freq_factor, short_factor, ...), frozen
    scaling: tuple = ()
    # the RopeVariant of rope_type, resolved when the spec is built through the plugin host
    # (``Host.describe`` / ``Host.resolved``); the codec reads it. Not part of equality or to_dict.
    variant: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.variant is not None and getattr(self.variant, "name", self.rope_type) != self.rope_type:
            object.__setattr__(self, "variant", None)  # replace(spec, rope_type=...): the old variant no longer applies

    @property
    def rotary_dim(self) -> int:
        """Number of leading dims that rotate (even)."""
        dim = int(self.head_dim * self.partial_factor)
        return dim - (dim % 2)

    def param(self, name: str, default: Any = None) -> Any:
        return self.params.get(name, default)

    @property
    def params(self) -> dict:
        return {k: _thaw(v) if isinstance(v, tuple) else v for k, v in self.scaling}

    @property
    def is_stateful(self) -> bool:
        """True when the table depends on the length of the forward that made each key."""
        return self.rope_type in ("dynamic", "longrope")

    def with_variant(self, lookup) -> "RopeSpec":
        """This spec carrying ``lookup(rope_type)`` (None: unknown, left unresolved) unless it has one."""
        return self if self.variant is not None else replace(self, variant=lookup(self.rope_type))

    def to_dict(self) -> dict:
        names = "theta head_dim partial_factor rotary_dim interleaved max_position_embeddings".split()
        return {"type": self.rope_type, **{k: getattr(self, k) for k in names}, "scaling": self.params}

    @classmethod
    def from_dict(cls, data: Mapping) -> "RopeSpec":
        return cls(
            rope_type=data["type"],
            theta=float(data["theta"]),
            head_dim=int(data["head_dim"]),
            partial_factor=float(data.get("partial_factor", 1.0)),
            interleaved=bool(data.get("interleaved", False)),
            max_position_embeddings=int(data.get("max_position_embeddings", 2048)),
            scaling=freeze(data.get("scaling") or {}),
        )

    @classmethod
    def make(
        cls,
        rope_type: str = "default",
        theta: float = 10000.0,
        *,
        head_dim: int,
        partial_factor: float = 1.0,
        interleaved: bool = False,
        max_position_embeddings: int = 2048,
        **scaling: Any,
    ) -> "RopeSpec":
        """Build a RopeSpec with keyword scaling parameters (``factor=8.0`` ...)."""
        return cls(
            rope_type=rope_type,
            theta=float(theta),
            head_dim=int(head_dim),
            partial_factor=float(partial_factor),
            interleaved=bool(interleaved),
            max_position_embeddings=int(max_position_embeddings),
            scaling=freeze({k: v for k, v in scaling.items() if v is not None}),
        )


@dataclass(frozen=True)
class ModelSpec:
    """The KV geometry of a model, as its cache stores it."""

    model_type: str  # config's model_type ("llama", "gemma3_text", ...)
    num_layers: int  # decoder layers (each with a KV cache unless listed in no_kv_layers)
    num_attention_heads: int  # query heads
    num_kv_heads: int  # KV heads *as stored in the cache* (Falcon new arch stores all heads)
    head_dim: int  # per-head dim of K and V
    hidden_size: int
    positional: str = "rope"  # one of POSITIONAL_KINDS
    rope: RopeSpec | None = None  # the table of full-attention layers (or of every layer)
    # per-layer-type tables (Gemma3: sliding layers use a different base), frozen pairs
    rope_by_layer_type: tuple = ()
    sliding_window: int | None = None  # window of sliding layers, None when none
    layer_types: tuple = ()  # per layer: FULL or SLIDING (len == num_layers)
    qk_norm: bool = False  # q/k normalised before RoPE (Qwen3, OLMo2, Gemma3, Cohere ...)
    dtype: str = "float32"  # the config's dtype ("bfloat16", ...)
    vocab_size: int = 0
    max_position_embeddings: int = 0
    family: str = ""  # the adapter that produced this spec
    extras: tuple = ()  # family-specific facts, frozen pairs (e.g. ("qk_norm_scope", "projection"))
    # -- per-layer facts (defaults: every layer alike, as above; serialised only when set) -
    nope_layers: tuple = ()  # layers whose keys carry no positional encoding (SmolLM3, Llama 4, Cohere 2)
    attention_chunk_size: int | None = None  # chunk of CHUNKED layers (Llama 4)
    layer_kv_heads: tuple = ()  # per layer KV heads as cached when they differ (0: no own KV)
    layer_head_dims: tuple = ()  # per layer key head dim when it differs (0: no own KV)
    value_head_dim: int | None = None  # value width when it differs from the key's (MLA)
    kv_shared_layers: tuple = ()  # layers that reuse an earlier layer's KV (no own cache entry)
    no_kv_layers: tuple = ()  # layers with no KV at all (recurrent / conv / MLP-only)
    state_layers: tuple = ()  # layers holding recurrent or convolution state (hybrid models)
    cache_format: str = "kv"  # one of CACHE_FORMATS
    kv_groups: int | None = None  # KV groups computed when the cache duplicates them (Falcon new arch)
    latent: tuple = ()  # MLA sizes, frozen pairs (kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim)
    # sparse attention (DSA): layers that also cache single-head indexer keys [B, T, head_dim], and
    # their geometry, frozen pairs (head_dim, rope_dim, rope_offset: where the rotated dims start)
    indexer_layers: tuple = ()
    indexer: tuple = ()

    def __post_init__(self) -> None:
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(f"positional must be one of {POSITIONAL_KINDS}, got {self.positional!r}")
        for name in ("layer_types", "layer_kv_heads", "layer_head_dims"):
            value = getattr(self, name)
            if value and len(value) != self.num_layers:
                raise ValueError(f"{name} has {len(value)} entries for {self.num_layers} layers")
        if self.cache_format not in CACHE_FORMATS:
            raise ValueError(f"cache_format must be one of {CACHE_FORMATS}, got {self.cache_format!r}")

    # -- queries -------------------------------------------------------------------
    @property
    def kv_group_size(self) -> int:
        return max(1, self.num_attention_heads // max(1, self.num_kv_heads))

    @property
    def attention_kind(self) -> str:
        kinds = frozenset(self.layer_types or (FULL,))
        return {frozenset({FULL}): "full", frozenset({SLIDING}): "sliding"}.get(kinds, "hybrid")

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else FULL

    @property
    def kv_layers(self) -> tuple:
        """Layers whose own K/V the cache holds."""
        skip = set(self.no_kv_layers) | set(self.kv_shared_layers)
        return tuple(i for i in range(self.num_layers) if i not in skip)

    def kv_heads_of(self, layer: int) -> int:
        """KV heads layer ``layer`` caches (0 for a layer without its own KV)."""
        if layer in self.no_kv_layers or layer in self.kv_shared_layers:
            return 0
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_kv_heads

    def key_dim_of(self, layer: int) -> int:
        if layer in self.no_kv_layers or layer in self.kv_shared_layers:
            return 0
        return self.layer_head_dims[layer] if self.layer_head_dims else self.head_dim

    def value_dim_of(self, layer: int) -> int:
        if layer in self.no_kv_layers or layer in self.kv_shared_layers:
            return 0
        return self.value_head_dim if self.value_head_dim is not None else self.key_dim_of(layer)

    @property
    def uniform_kv(self) -> bool:
        """True when every layer caches K and V of one shape (the classic layout)."""
        return not (
            self.layer_kv_heads
            or self.layer_head_dims
            or self.value_head_dim is not None
            or self.no_kv_layers
            or self.kv_shared_layers
        )

    def window_of(self, layer: int) -> int | None:
        """Tokens layer ``layer`` attends to (None: the whole prefix)."""
        return {SLIDING: self.sliding_window, CHUNKED: self.attention_chunk_size}.get(self.layer_type(layer))

    def positional_of(self, layer: int) -> str:
        """The positional scheme of one layer's cached keys ("none" for NoPE layers)."""
        return "none" if self.positional == "rope" and layer in self.nope_layers else self.positional

    def rope_for_layer(self, layer: int) -> RopeSpec | None:
        """The RoPE table used by ``layer`` (per-layer-type tables take precedence; None for NoPE layers)."""
        if self.positional != "rope" or layer in self.nope_layers:
            return None
        return dict(self.rope_by_layer_type).get(self.layer_type(layer), self.rope)

    def indexer_dim(self) -> int:
        """Head dim of the cached indexer keys (0 when the model has none)."""
        return int(dict(self.indexer).get("head_dim", 0)) if self.indexer_layers else 0

    def indexer_rope_for_layer(self, layer: int) -> tuple[RopeSpec | None, int, int]:
        """(table, first rotated dim, rotated dims) of one layer's indexer keys; the rotated part
        is laid out half-split whatever the pairing of the query input (transformers' interleaved
        RoPE writes its output de-interleaved)."""
        table = self.rope_for_layer(layer)
        info = dict(self.indexer)
        dims = int(info.get("rope_dim", 0))
        if table is None or not dims:
            return None, 0, 0
        table = replace(table, head_dim=dims, partial_factor=1.0, interleaved=False)
        return table, int(info.get("rope_offset", 0)), dims

    def extra(self, name: str, default: Any = None) -> Any:
        return dict(self.extras).get(name, default)

    def with_dtype(self, dtype: str) -> "ModelSpec":
        return replace(self, dtype=dtype)

    def with_rope_variants(self, lookup) -> "ModelSpec":
        """Every RoPE table of this spec carrying its variant, ``lookup(rope_type)`` (see :class:`RopeSpec`)."""
        if self.rope is None and not self.rope_by_layer_type:
            return self
        return replace(
            self,
            rope=self.rope.with_variant(lookup) if self.rope is not None else None,
            rope_by_layer_type=tuple((k, v.with_variant(lookup)) for k, v in self.rope_by_layer_type),
        )

    # -- serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict:
        head = "model_type family num_layers num_attention_heads num_kv_heads head_dim hidden_size positional"
        out = {
            **{k: getattr(self, k) for k in head.split()},
            "rope": self.rope.to_dict() if self.rope else None,
            "rope_by_layer_type": {k: v.to_dict() for k, v in self.rope_by_layer_type},
            "sliding_window": self.sliding_window,
            "layer_types": list(self.layer_types),
            **{k: getattr(self, k) for k in ("qk_norm", "dtype", "vocab_size", "max_position_embeddings")},
            "extras": {k: _thaw(v) if isinstance(v, tuple) else v for k, v in self.extras},
        }
        for name, default in _OPTIONAL_FIELDS.items():  # only when set: old fingerprints stay valid
            if getattr(self, name) != default:
                out[name] = _thaw(getattr(self, name))  # layer tuples -> lists, frozen pairs -> dicts
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> "ModelSpec":
        rope = data.get("rope")
        return cls(
            model_type=data["model_type"],
            family=data.get("family", ""),
            **{k: int(data[k]) for k in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim")},
            hidden_size=int(data.get("hidden_size", 0)),
            positional=data.get("positional", "rope"),
            rope=RopeSpec.from_dict(rope) if rope else None,
            rope_by_layer_type=tuple(
                sorted((k, RopeSpec.from_dict(v)) for k, v in (data.get("rope_by_layer_type") or {}).items())
            ),
            sliding_window=data.get("sliding_window"),
            layer_types=tuple(data.get("layer_types") or ()),
            qk_norm=bool(data.get("qk_norm", False)),
            dtype=data.get("dtype", "float32"),
            vocab_size=int(data.get("vocab_size", 0)),
            max_position_embeddings=int(data.get("max_position_embeddings", 0)),
            extras=freeze(data.get("extras") or {}),
            **{
                name: (
                    freeze(data[name])
                    if name in ("latent", "indexer")
                    else tuple(data[name])
                    if isinstance(default, tuple)
                    else data[name]
                )
                for name, default in _OPTIONAL_FIELDS.items()
                if name in data
            },
        )

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the geometry (dtype excluded: it is checked apart)."""
        data = {k: v for k, v in self.to_dict().items() if k != "dtype"}
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


_FIELDS = fields(ModelSpec)
#: the per-layer fields (``nope_layers`` and every field after it) and their defaults: serialised only when set
_OPTIONAL_FIELDS = {f.name: f.default for f in _FIELDS[[f.name for f in _FIELDS].index("nope_layers") :]}
