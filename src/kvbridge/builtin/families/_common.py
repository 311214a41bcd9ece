"""Config normalisation shared by the built-in family adapters (pure python, no torch).

Published ``config.json`` files come in two dialects: transformers 4.x keys (``rope_theta``,
``rope_scaling`` with an old ``"type"`` key, ``torch_dtype``, NeoX ``rotary_pct`` /
``rotary_emb_base``, Gemma3 ``rope_local_base_freq``, Phi3 top-level
``original_max_position_embeddings``, GPT-J ``rotary_dim``) and the transformers 5 form
(everything in ``rope_parameters``, nested per layer type for Gemma3, ``dtype``). The helpers
here fold both into one flat parameter dict per RoPE table, following what the transformers
5.24 config classes do at load time (``RotaryEmbeddingConfigMixin`` and the per-family
overrides), so a :class:`~kvbridge.spec.ModelSpec` agrees with the model transformers builds.

:class:`DecoderAdapter` is the shared base of the built-in adapters: ``describe`` is a template
method whose steps (head dim, KV heads as cached, RoPE tables, sliding layout, q/k norm) a
family file overrides where its model differs.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from kvbridge.check.validate import rope_parameters, theta_fields
from kvbridge.family_adapter import FamilyAdapter, positive_int
from kvbridge.errors import ConfigError
from kvbridge.spec import FULL, SLIDING, ModelSpec, RopeSpec, freeze

#: rope types whose pretraining length ``original_max_position_embeddings`` transformers fills in
NEEDS_ORIGINAL_MAX = ("llama3", "yarn", "longrope")
#: keys of a rope-parameter dict that are not scaling parameters of the rope type
ROPE_META_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
#: legacy layer-type names transformers renames at load
LEGACY_LAYER_TYPES = {"attention": FULL}


# -- reading fields -------------------------------------------------------------------------
def as_mapping(config: Any) -> dict:
    """A plain dict from a config mapping or a transformers config object (never mutated)."""
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise ConfigError(
        f"expected a config mapping, got {type(config).__name__}",
        "pass the parsed config.json (a dict) or a transformers config object",
    )


def get(config: Mapping, name: str, default: Any = None) -> Any:
    """``config[name]`` when the key is present (even if None), else ``default``.

    This is how a transformers config class treats its fields: a key saved as ``null`` keeps
    the value None, a missing key takes the class default.
    """
    return config[name] if name in config else default


def first_present(config: Mapping, names: tuple, default: Any = None) -> Any:
    """The value of the first of ``names`` present with a non-None value, else ``default``."""
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def bad_field(name: str, must: str, value: Any, model_type: Any = None) -> ConfigError:
    """The one-line error of config field ``name`` whose ``value`` is not ``must`` (e.g. "a number")."""
    return ConfigError(
        f"config field {name!r} must be {must}, got {value!r}",
        f"fix {name!r} in the config (model_type {model_type!r})",
    )


def check_positive_int(value: Any, name: str, model_type: Any = None) -> int:
    """``value`` if it is a positive int, else a one-line ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise bad_field(name, "a positive integer", value, model_type)
    return value


def optional_positive_int(config: Mapping, name: str, default: Any = None) -> int | None:
    """A positive int field that may be absent (-> ``default``) or null (-> None)."""
    value = get(config, name, default)
    return None if value is None else check_positive_int(value, name, config.get("model_type"))


def flag(config: Mapping, name: str, default: bool = False) -> bool:
    value = get(config, name, default)
    return bool(default if value is None else value)


def dtype_name(config: Mapping) -> str:
    """The config's dtype (``dtype``, else legacy ``torch_dtype``), default ``"float32"``."""
    return str(first_present(config, ("dtype", "torch_dtype"), "float32")).removeprefix("torch.")


def number(value: Any, name: str, model_type: Any = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_field(name, "a number", value, model_type)
    return float(value)


# -- RoPE parameters --------------------------------------------------------------------------
def rotary_fraction(rotary_dim: int, head_dim: int) -> float:
    """The ``partial_factor`` whose ``int(head_dim * f)`` is exactly ``rotary_dim``."""
    factor = rotary_dim / head_dim
    while int(head_dim * factor) < rotary_dim:  # guard against float rounding down
        factor = math.nextafter(factor, math.inf)
    return factor


def rope_spec(
    params: Mapping,
    *,
    head_dim: int,
    partial_factor: float = 1.0,
    interleaved: bool = False,
    max_position_embeddings: int,
) -> RopeSpec:
    """A :class:`RopeSpec` from a normalised rope-parameter dict (see ``DecoderAdapter._rope_parameters``)."""
    rope_parameters(params)  # theta finite > 0, a known type, a positive factor where one is needed
    scaling = {k: v for k, v in params.items() if k not in ROPE_META_KEYS and v is not None}
    return RopeSpec(
        rope_type=str(params.get("rope_type", "default")),
        theta=float(params["rope_theta"]),
        head_dim=int(head_dim),
        partial_factor=float(partial_factor),
        interleaved=bool(interleaved),
        max_position_embeddings=int(max_position_embeddings),
        scaling=freeze(scaling),
    )


# -- layer layout ------------------------------------------------------------------------------
def layer_types_from(config: Mapping, num_layers: int, default: list | tuple) -> tuple:
    """The config's ``layer_types`` (legacy names renamed), else ``default``; checked."""
    given = config.get("layer_types")
    types = default if given is None else given
    if not isinstance(types, (list, tuple)):
        raise ConfigError(
            f"config field 'layer_types' must be a list, got {types!r}",
            "give one 'full_attention' or 'sliding_attention' per layer",
        )
    types = tuple(LEGACY_LAYER_TYPES.get(t, t) for t in types)
    if len(types) != num_layers:
        raise ConfigError(
            f"config field 'layer_types' has {len(types)} entries for {num_layers} layers",
            "give one entry per layer (num_hidden_layers)",
        )
    bad = [t for t in types if t not in (FULL, SLIDING)]
    if bad:
        raise ConfigError(
            f"config field 'layer_types' has unsupported entry {bad[0]!r}",
            f"use {FULL!r} or {SLIDING!r} (model_type {config.get('model_type')!r})",
        )
    return types


# -- the shared adapter ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DecoderAdapter(FamilyAdapter):
    """Base of the built-in adapters: ``describe`` for decoder-only Hugging Face models.

    Class-level knobs (``ClassVar``, not dataclass fields) carry the family's transformers
    defaults; override the ``_step`` methods where a family's model reads its config
    differently. ``tiny_configs`` returns named small configs; ``tiny_config`` the first.
    """

    #: config keys of the three required sizes (first present wins)
    LAYERS_KEYS: ClassVar[tuple] = ("num_hidden_layers",)
    HEADS_KEYS: ClassVar[tuple] = ("num_attention_heads",)
    HIDDEN_KEYS: ClassVar[tuple] = ("hidden_size",)
    MAX_POSITIONS_KEYS: ClassVar[tuple] = ("max_position_embeddings",)
    #: transformers class defaults of the optional fields the adapter reads
    DEFAULT_VOCAB: ClassVar[int] = 32000
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 2048
    #: default of ``num_key_value_heads`` when the key is absent (None: same as query heads)
    DEFAULT_KV_HEADS: ClassVar[int | None] = None
    #: ``head_dim`` key the model honours (None: always hidden_size // heads), and its default
    HEAD_DIM_KEY: ClassVar[str | None] = "head_dim"
    DEFAULT_HEAD_DIM: ClassVar[int | None] = None
    DEFAULT_THETA: ClassVar[float] = 10000.0
    #: top-level config keys of the RoPE base and rotated fraction, in the order the model reads them
    THETA_KEYS: ClassVar[tuple] = ("rope_theta",)
    PARTIAL_KEYS: ClassVar[tuple] = ("partial_rotary_factor",)
    #: GPT-J style ``(key, default)``: the rotated width in dims (``null``: the whole head) at the fixed
    #: base ``DEFAULT_THETA``; the config's rope parameters are not read
    ROTARY_DIM: ClassVar[tuple | None] = None
    #: True when the model rotates only the first ``partial_rotary_factor`` of each head
    PARTIAL_ROTARY: ClassVar[bool] = False
    DEFAULT_PARTIAL: ClassVar[float | None] = None
    INTERLEAVED: ClassVar[bool] = False
    #: config flag of q/k normalisation (True/False: fixed for the family)
    QK_NORM: ClassVar[str | bool] = False
    #: Mistral / Phi3 style: one ``sliding_window`` (default ``DEFAULT_WINDOW``) on every layer when set
    ALL_SLIDING: ClassVar[bool] = False
    DEFAULT_WINDOW: ClassVar[int | None] = None
    #: True when every query head is cached (GPT-2, GPT-J, NeoX: no ``num_key_value_heads``)
    MHA: ClassVar[bool] = False
    #: how cached keys carry positions: ``"rope"`` (see ``_rope``) or ``"absolute"`` (learned, added to the input)
    POSITIONAL: ClassVar[str] = "rope"
    #: Gemma 2 style: layer ``i`` slides (window ``sliding_window``, default ``DEFAULT_WINDOW``) when
    #: ``(i + 1) % SLIDING_PATTERN`` (an explicit ``layer_types`` wins); None: no such pattern
    SLIDING_PATTERN: ClassVar[int | None] = None
    #: ``ModelSpec.extras`` every spec of the family carries
    EXTRAS: ClassVar[Mapping] = {}

    # -- describe ---------------------------------------------------------------------------
    def describe(self, config: Mapping) -> ModelSpec:
        cfg = as_mapping(config)
        num_layers = positive_int(cfg, *self.LAYERS_KEYS)
        heads = positive_int(cfg, *self.HEADS_KEYS)
        hidden = positive_int(cfg, *self.HIDDEN_KEYS)
        head_dim = self._head_dim(cfg, hidden, heads)
        kv_heads = self._cache_kv_heads(cfg, heads)
        if heads % kv_heads:
            raise ConfigError(
                f"{kv_heads} KV heads do not divide {heads} attention heads",
                "fix 'num_key_value_heads' (it must divide 'num_attention_heads')",
            )
        key = next((k for k in self.MAX_POSITIONS_KEYS if k in cfg), self.MAX_POSITIONS_KEYS[0])  # first present
        max_positions = check_positive_int(get(cfg, key, self.DEFAULT_MAX_POSITIONS), key, cfg.get("model_type"))
        positional = self._positional(cfg)
        rope, by_type = self._rope(cfg, head_dim, max_positions) if positional == "rope" else (None, ())
        window, layer_types = self._layout(cfg, num_layers)
        return ModelSpec(
            model_type=str(cfg.get("model_type") or self.model_types[0]),
            family=self.name,
            num_layers=num_layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            hidden_size=hidden,
            positional=positional,
            rope=rope,
            rope_by_layer_type=by_type,
            sliding_window=window,
            layer_types=layer_types,
            qk_norm=self._qk_norm(cfg),
            dtype=dtype_name(cfg),
            vocab_size=check_positive_int(
                get(cfg, "vocab_size", self.DEFAULT_VOCAB), "vocab_size", cfg.get("model_type")
            ),
            max_position_embeddings=max_positions,
            extras=freeze(self._extras(cfg)),
        )

    # -- steps (override per family) ----------------------------------------------------------
    def _head_dim(self, cfg: Mapping, hidden: int, heads: int) -> int:
        explicit = get(cfg, self.HEAD_DIM_KEY, self.DEFAULT_HEAD_DIM) if self.HEAD_DIM_KEY else None
        if explicit is not None:
            return check_positive_int(explicit, self.HEAD_DIM_KEY, cfg.get("model_type"))
        if hidden % heads:
            raise ConfigError(
                f"hidden_size {hidden} is not a multiple of {heads} attention heads",
                "fix 'hidden_size' or 'num_attention_heads', or give 'head_dim'",
            )
        return hidden // heads

    def _cache_kv_heads(self, cfg: Mapping, heads: int) -> int:
        if self.MHA:
            return heads
        return optional_positive_int(cfg, "num_key_value_heads", self.DEFAULT_KV_HEADS) or heads

    def _positional(self, cfg: Mapping) -> str:
        return self.POSITIONAL

    def rotary_embedding(self, model, layer: int = 0):
        # None where keys carry no RoPE (GPT-2; Falcon's ALiBi models build a rotary module but never call it)
        return super().rotary_embedding(model, layer) if self._positional(as_mapping(model.config)) == "rope" else None

    def _rope_parameters(self, cfg: Mapping, max_positions: int) -> dict:
        """One normalised rope-parameter dict, as transformers 5 stores ``config.rope_parameters``.

        Precedence follows the transformers config classes: ``rope_scaling`` (legacy alias) when it
        is non-empty, else ``rope_parameters``; inside it, keys already present win over top-level
        legacy keys (``THETA_KEYS`` / ``PARTIAL_KEYS``, in order), which win over the defaults.
        The result always has ``rope_type`` and ``rope_theta``; ``partial_rotary_factor`` when the
        config or the family gives one; ``original_max_position_embeddings`` for llama3 / yarn /
        longrope, defaulting to ``max_positions`` (the model's effective max positions).
        """
        model_type = cfg.get("model_type")
        theta_fields(cfg, self.THETA_KEYS)  # a bad top-level theta is refused even where rope_parameters wins
        where = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
        given = cfg.get(where)
        if given is not None and not isinstance(given, Mapping):
            raise bad_field(where, "a mapping", given, model_type)
        params = copy.deepcopy(dict(given or {}))
        if params.get("rope_theta") is None:
            params["rope_theta"] = first_present(cfg, self.THETA_KEYS, self.DEFAULT_THETA)
        params["rope_theta"] = number(params["rope_theta"], "rope_theta", model_type)
        partial = params.get("partial_rotary_factor")
        if partial is None:
            partial = first_present(cfg, self.PARTIAL_KEYS, self.DEFAULT_PARTIAL)
        if partial is None:
            params.pop("partial_rotary_factor", None)
        else:
            partial = number(partial, "partial_rotary_factor", model_type)
            if not 0.0 < partial <= 1.0:
                raise bad_field("partial_rotary_factor", "in (0, 1]", partial, model_type)
            params["partial_rotary_factor"] = partial
        params["rope_type"] = str(params.get("rope_type") or params.get("type") or "default")
        params.pop("type", None)
        if params["rope_type"] in NEEDS_ORIGINAL_MAX and params.get("original_max_position_embeddings") is None:
            params["original_max_position_embeddings"] = max_positions
        return params

    def _rotary_dim(self, cfg: Mapping, head_dim: int) -> int:
        key, default = self.ROTARY_DIM
        rotary_dim = optional_positive_int(cfg, key, default)
        if rotary_dim is None:
            return head_dim
        if rotary_dim > head_dim or rotary_dim % 2:
            raise bad_field(key, f"even and <= head dim {head_dim}", rotary_dim, cfg.get("model_type"))
        return rotary_dim

    def _rope(self, cfg: Mapping, head_dim: int, max_positions: int) -> tuple[RopeSpec, tuple]:
        if self.ROTARY_DIM:
            params = {"rope_type": "default", "rope_theta": self.DEFAULT_THETA}
            partial = rotary_fraction(self._rotary_dim(cfg, head_dim), head_dim)
        else:
            params = self._rope_parameters(cfg, max_positions)
            # without PARTIAL_ROTARY the model rotates the whole head whatever the config says
            partial = float(params.get("partial_rotary_factor", 1.0)) if self.PARTIAL_ROTARY else 1.0
        return rope_spec(
            params,
            head_dim=head_dim,
            partial_factor=partial,
            interleaved=self.INTERLEAVED,
            max_position_embeddings=max_positions,
        ), ()

    def _layout(self, cfg: Mapping, num_layers: int) -> tuple[int | None, tuple]:
        """(sliding window, per-layer types); default: no sliding layers (see ``ALL_SLIDING``, ``SLIDING_PATTERN``)."""
        if not (self.ALL_SLIDING or self.SLIDING_PATTERN):
            return None, (FULL,) * num_layers
        window = optional_positive_int(cfg, "sliding_window", self.DEFAULT_WINDOW)
        if self.ALL_SLIDING:  # Mistral / Phi3: one window on every layer when set
            return window, ((SLIDING if window is not None else FULL),) * num_layers
        default = [SLIDING if (i + 1) % self.SLIDING_PATTERN else FULL for i in range(num_layers)]
        return window, layer_types_from(cfg, num_layers, default)

    def _qk_norm(self, cfg: Mapping) -> bool:
        return self.QK_NORM if isinstance(self.QK_NORM, bool) else flag(cfg, self.QK_NORM, False)

    def _extras(self, cfg: Mapping) -> dict:
        return dict(self.EXTRAS)

    # -- tiny configs ---------------------------------------------------------------------------
    def tiny_configs(self) -> dict[str, dict]:
        """Named small configs of this family (the first is :meth:`tiny_config`)."""
        raise NotImplementedError(f"adapter {self.name!r} has no tiny_configs()")

    def tiny_config(self) -> dict:
        return copy.deepcopy(next(iter(self.tiny_configs().values())))


def tiny_base(model_type: str, **overrides: Any) -> dict:
    """A small Llama-like config skeleton (2 layers, hidden 64, 4 heads / 2 KV heads)."""
    return {
        "model_type": model_type,
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "dtype": "float32",
        **overrides,
    }


def layer_attr(layer_cfg, name: str, default=None):
    """``layer_cfg.name``, or ``default`` when unset or when a heterogeneous config raises on the read."""
    try:
        value = getattr(layer_cfg, name)
    except Exception:  # heterogeneous configs raise on ambiguous global reads
        return default
    return default if value is None else value
