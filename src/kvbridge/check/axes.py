"""The single axes of a compatibility check: each function compares one property of two
:class:`~kvbridge.spec.ModelSpec` and returns an :class:`~kvbridge.check.report.Axis`
(what decides each axis: see :mod:`kvbridge.check.compat`).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Mapping

from kvbridge.check.layers import layout_axis, nope_note as _nope_note
from kvbridge.check.report import Axis
from kvbridge.spec import CHUNKED, FULL, SLIDING, ModelSpec, RopeSpec

#: rope types whose table depends on max_position_embeddings
LENGTH_DEPENDENT_ROPE = ("dynamic", "yarn", "longrope")
#: config keys that do not change what the model computes (left out of the config fingerprint,
#: :func:`kvbridge.models.fingerprint.config_fingerprint`)
CONFIG_IGNORED = frozenset(
    {
        "_name_or_path",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "architectures",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "use_cache",
        "_commit_hash",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
    }
)
#: config keys that do not change a model's weights or its KV geometry (for the model axis)
NON_ARCH_KEYS = CONFIG_IGNORED | frozenset(
    {
        "auto_map",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "attention_dropout",
        "attn_pdrop",
        "resid_pdrop",
        "embd_pdrop",
        "hidden_dropout",
        "summary_first_dropout",
        "initializer_range",
        "task_specific_params",
        "tokenizer_class",
        "chat_template",
        "generation_config",
        "cache_implementation",
        "cache_config",
        "quantization_config",
        "pretraining_tp",
        "id2label",
        "label2id",
        "problem_type",
        "use_return_dict",
        "torchscript",
        "tie_encoder_decoder",
        "is_decoder",
        "is_encoder_decoder",
        "prefix",
        "finetuning_task",
        "n_ctx",
        "summary_type",
        "summary_use_proj",
        "summary_activation",
        "summary_proj_to_labels",
    }
)
#: config keys that only change positions or the attention window
POSITION_KEYS = frozenset(
    {
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "rope_local_base_freq",
        "rotary_emb_base",
        "max_position_embeddings",
        "original_max_position_embeddings",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
        "sliding_window_pattern",
        "n_positions",
        "seq_length",
        "max_sequence_length",
    }
)


def _kv_layers(spec: ModelSpec) -> tuple[int, tuple]:
    skip = tuple(sorted(set(spec.no_kv_layers) | set(spec.kv_shared_layers)))
    return spec.num_layers - len(skip), skip


def _layers_axis(s: ModelSpec, t: ModelSpec) -> Axis:
    axis = partial(Axis, "layers", s.num_layers, t.num_layers)
    s_kv, s_skip = _kv_layers(s)
    t_kv, t_skip = _kv_layers(t)
    note = f" (KV layers: {s_kv} vs {t_kv}; layers without their own KV are skipped)" if s_skip or t_skip else ""
    if s_kv == t_kv:
        return axis("same", f"layer i maps to layer i{note}")
    direction = "deeper" if t_kv > s_kv else "shallower"
    return axis(
        "mappable",
        f"target is {direction} ({s_kv} -> {t_kv} KV layers): fit each target layer from the"
        f" top-k source layers by R^2 (or depth-proportional / last-aligned pairing){note}",
    )


def _head_kind(spec: ModelSpec) -> str:
    if spec.kv_groups is not None and spec.kv_groups < spec.num_kv_heads:
        return f"{spec.kv_groups} KV groups cached duplicated per query head"
    if spec.num_kv_heads == 1:
        return "MQA"
    if spec.num_kv_heads == spec.num_attention_heads:
        return "MHA"
    return f"GQA {spec.kv_group_size}:1"


def _kv_heads_axis(s: ModelSpec, t: ModelSpec) -> Axis:
    axis = partial(Axis, "kv_heads", s.num_kv_heads, t.num_kv_heads)
    falcon = (
        "; Falcon new architecture: the cache holds every query head (KV groups duplicated),"
        " so map the unique heads and duplicate them per group"
        if any(spec.kv_groups is not None and spec.kv_groups < spec.num_kv_heads for spec in (s, t))
        else ""
    )
    kinds = f"{_head_kind(s)} vs {_head_kind(t)}"
    if s.num_kv_heads == t.num_kv_heads:
        return axis("same", f"same count ({kinds}): head h lines up with head h{falcon}")
    return axis("mappable", f"{kinds}: fit each target KV head from all source KV heads of the chosen layers{falcon}")


def _dims(spec: ModelSpec):
    """The head width as reported: an int, or ``"K 32 / V 8"`` where values have their own width."""
    value = spec.value_head_dim
    return spec.head_dim if value is None or value == spec.head_dim else f"K {spec.head_dim} / V {value}"


def _head_dim_axis(s: ModelSpec, t: ModelSpec) -> Axis:
    sv, tv = _dims(s), _dims(t)
    axis = partial(Axis, "head_dim", sv, tv)
    if sv == tv:
        return axis("same", "K/V widths agree")
    return axis("mappable", f"per-head ridge from {sv} to {tv} dims (keys in RoPE-free content space)")


def _positional_axis(s: ModelSpec, t: ModelSpec) -> Axis:
    sp, tp = s.positional, t.positional
    axis = partial(Axis, "positional", sp, tp)
    if sp == tp:
        action = {
            "rope": "positions live in the keys' rotation: strip and re-apply RoPE to move them",
            "absolute": (
                "positions are mixed into the keys by the layers below (learned position embeddings,"
                " or position-dependent layers such as Inkling's query scaling): keep every"
                " token at the position it was computed at (no re-positioning)"
            ),
            "alibi": "ALiBi adds positions at attention time: cached keys are position-free",
            "none": "no positional encoding: cached keys are position-free",
        }[sp]
        return axis("same", action)
    if "absolute" in (sp, tp):
        side = "source" if sp == "absolute" else "target"
        why = (
            "source keys carry absolute positions mixed in by every layer below; they cannot"
            " be stripped to content space"
            if side == "source"
            else "target keys must carry absolute positions mixed in by its layers below; a"
            " cached-key transfer cannot produce them"
        )
        return axis("blocking", f"{why} (re-prefill the target instead)")
    if sp == "rope":
        return axis("mappable", f"strip the source RoPE: the target ({tp}) expects position-free keys")
    if tp == "rope":
        return axis("mappable", f"source keys are position-free ({sp}): apply the target RoPE at each token's position")
    return axis("same", f"both position-free in the cache ({sp} vs {tp})")


def _rope_params(r: RopeSpec) -> dict:
    """The parameters that decide a RoPE table (its size follows from head_dim)."""
    out = {
        "type": r.rope_type,
        "theta": r.theta,
        "partial_factor": r.partial_factor,
        "interleaved": r.interleaved,
        "scaling": r.params,
    }
    if r.rope_type in LENGTH_DEPENDENT_ROPE:
        out["max_position_embeddings"] = r.max_position_embeddings
    return out


def _rope_value(spec: ModelSpec) -> dict | None:
    if spec.positional != "rope" or spec.rope is None:
        return None
    out = _rope_params(spec.rope)
    if spec.rope_by_layer_type:
        out["by_layer_type"] = {k: _rope_params(v) for k, v in spec.rope_by_layer_type}
    return out


def _rope_brief(r: RopeSpec) -> str:
    bits = [r.rope_type, f"theta={r.theta:g}"]
    if r.partial_factor != 1.0:
        bits.append(f"rotary {r.rotary_dim}/{r.head_dim}")
    if r.interleaved:
        bits.append("interleaved")
    factor = r.param("factor")
    if isinstance(factor, (int, float)):
        bits.append(f"factor={factor:g}")
    return " ".join(bits)


def _tables(spec: ModelSpec) -> dict[str, RopeSpec]:
    """The distinct RoPE tables a model's layers use, by canonical parameter JSON."""
    out: dict[str, RopeSpec] = {}
    for layer in range(spec.num_layers):
        table = spec.rope_for_layer(layer)
        if table is not None:
            out.setdefault(json.dumps(_rope_params(table), sort_keys=True, default=str), table)
    return out


def _rope_axis(s: ModelSpec, t: ModelSpec) -> Axis:
    axis = _rope_axis_tables(s, t)
    note = _nope_note(s, t)
    if not note:
        return axis
    verdict = "mappable" if axis.verdict == "same" else axis.verdict
    source = dict(axis.source or {}, nope_layers=list(s.nope_layers)) if isinstance(axis.source, dict) else axis.source
    target = dict(axis.target or {}, nope_layers=list(t.nope_layers)) if isinstance(axis.target, dict) else axis.target
    return Axis("rope", source, target, verdict, f"{note}; {axis.action}")


def _rope_axis_tables(s: ModelSpec, t: ModelSpec) -> Axis:
    sv, tv = _rope_value(s), _rope_value(t)
    axis = partial(Axis, "rope", sv, tv)
    if sv is None and tv is None:
        return Axis("rope", None, None, "same", "no RoPE on either side")
    if sv is None or tv is None:
        other = t if sv is None else s
        if "absolute" in (s.positional, t.positional):
            return axis("blocking", "RoPE on one side, absolute positions on the other (see positional)")
        what = "apply the target RoPE" if sv is None else "strip the source RoPE"
        return axis("mappable", f"{what} ({_rope_brief(other.rope)})")
    s_tabs, t_tabs = _tables(s), _tables(t)
    notes = [
        f"{side} {spec.rope.rope_type} RoPE depends on each forward's length: the state"
        " records forward lengths (rope_lengths) to pick each key's table"
        for side, spec in (("source", s), ("target", t))
        if spec.rope is not None and spec.rope.is_stateful
    ]
    if {r.interleaved for r in s_tabs.values()} != {r.interleaved for r in t_tabs.values()}:
        notes.append("pairing differs (interleaved vs half-split): strip and apply each with its own convention")
    note = ("; " + "; ".join(notes)) if notes else ""
    if set(s_tabs) == set(t_tabs):
        same = (
            "same RoPE tables: keys keep their rotation (re-rotate only to move positions)"
            if s.head_dim == t.head_dim
            else "same RoPE parameters, sized to each head dim: a fitted mapping strips them before and applies them after"
        )
        return axis("same", same + note)
    change = (
        f"{', '.join(sorted({_rope_brief(r) for r in s_tabs.values()}))} -> "
        f"{', '.join(sorted({_rope_brief(r) for r in t_tabs.values()}))}"
    )
    if len(s_tabs) > 1 or len(t_tabs) > 1:
        change = "per layer type: " + change
    return axis(
        "mappable", f"strip the source RoPE and apply the target's ({change}); never skip the target re-rotation" + note
    )


def _window(spec: ModelSpec) -> int | None:
    """Tokens a windowed layer's cache keeps: the sliding window, or the chunk of chunked layers
    (transformers caches both in a sliding layer of that size)."""
    kinds = set(spec.layer_types or ())
    return spec.sliding_window if SLIDING in kinds else spec.attention_chunk_size if CHUNKED in kinds else None


def _attention_value(spec: ModelSpec) -> str:
    kinds = spec.layer_types or (FULL,) * spec.num_layers
    windowed = "chunked" if CHUNKED in kinds and SLIDING not in kinds else "sliding"
    n_sliding = sum(1 for k in kinds if k in (SLIDING, CHUNKED))
    n_full = len(kinds) - n_sliding
    if n_sliding == 0:
        text = "full"
    elif n_full == 0:
        text = f"{windowed} {_window(spec)}"
    else:
        text = f"hybrid {n_sliding} {windowed} {_window(spec)} + {n_full} full"
    _, skip = _kv_layers(spec)
    if skip:
        text += f", {len(skip)} layers without KV"
    return text


def _attention_axis(s: ModelSpec, t: ModelSpec) -> Axis:
    axis = partial(Axis, "attention", _attention_value(s), _attention_value(t))
    s_kind, t_kind = s.attention_kind, t.attention_kind
    s_win = _window(s) if s_kind != "full" else None
    t_win = _window(t) if t_kind != "full" else None
    same_layout = (
        s.layer_types == t.layer_types
        if s.num_layers == t.num_layers
        else (s_kind, sorted(set(s.layer_types))) == (t_kind, sorted(set(t.layer_types)))
    )
    if same_layout and s_win == t_win and _kv_layers(s)[1] == _kv_layers(t)[1]:
        if s_kind == "full":
            return axis("same", "full attention on both: every layer uses the whole prefix")
        return axis(
            "same",
            f"same window ({s_win}) on the same layer types: extraction keeps the full history;"
            f" injection keeps the last {s_win}-1 tokens of sliding layers, as the target's cache would"
            + (" (chunked layers attend within aligned chunks of that size)" if CHUNKED in s.layer_types else ""),
        )
    parts = []
    if s_win is not None and (t_win is None or t_kind == "hybrid" or t_win > s_win):
        parts.append(
            f"source sliding layers attended only to the last {s_win} tokens: for prefixes longer"
            f" than {s_win} their keys differ from what full-attention layers compute"
        )
    if t_win is not None:
        parts.append(f"target sliding layers keep only the last {t_win}-1 tokens: injection trims them")
    if s_kind == "hybrid" or t_kind == "hybrid":
        parts.append("layer types differ: pair sliding with sliding and full with full layers where possible")
    if _kv_layers(s)[1] != _kv_layers(t)[1]:
        parts.append("layers without KV differ: map onto the target's KV layers only")
    return axis("mappable", "; ".join(parts or ["attention layouts differ"]))


def _indexer_axis(s: ModelSpec, t: ModelSpec, same_model: bool) -> Axis:
    """Sparse-attention indexer keys: carried whole within one model, never mapped."""
    sv, tv = list(s.indexer_layers), list(t.indexer_layers)
    axis = partial(Axis, "indexer keys", sv, tv)
    if same_model and s.indexer == t.indexer and sv == tv:
        return axis("same", "the indexer keys of the sparse-attention layers move with K/V")
    if not tv:
        return axis("mappable", "the source's sparse-attention indexer keys are dropped: the target caches none")
    return axis(
        "blocking",
        f"target layers {tv} also cache sparse-attention indexer keys (1 x {t.indexer_dim()} per token, "
        "from the indexer's own projection of the hidden state): they cannot be mapped from another "
        "model; only a state extracted from the target continues exactly",
    )


def _dtype_axis(s: ModelSpec, t: ModelSpec) -> Axis:
    sd, td = s.dtype, t.dtype
    if sd == td:
        return Axis("dtype", sd, td, "same", "no cast")
    note = ""
    if td in ("float16", "half") and sd in ("bfloat16", "float32"):
        note = " (values beyond +-65504 overflow float16: check for inf)"
    elif {sd, td} == {"bfloat16", "float16"} or td in ("bfloat16", "float16") and sd == "float32":
        note = " (loses precision; RoPE un-rotation is exact only to the source precision)"
    return Axis("dtype", sd, td, "mappable", f"cast K/V from {sd} to {td}{note}")


def cache_format_of(spec: ModelSpec, config: Mapping | None = None, generation_config: Mapping | None = None) -> str:
    """How a model's own ``generate`` caches, from its config / generation config."""
    impl = cache_cfg = None
    for source in (generation_config or {}, config or {}):
        impl = impl or source.get("cache_implementation")
        cache_cfg = cache_cfg or source.get("cache_config")
    impl = str(impl or "dynamic")
    cache_cfg = cache_cfg if isinstance(cache_cfg, Mapping) else {}
    if impl in ("quantized", "quanto", "hqq") or cache_cfg.get("nbits"):
        return f"quantized ({cache_cfg.get('backend', 'quanto')}, {cache_cfg.get('nbits', 4)}-bit)"
    if impl == "dynamic" and spec.attention_kind != "full":
        return f"dynamic, sliding layers keep {_window(spec)}-1 tokens"
    return impl


def _cache_axis(sv: str, tv: str) -> Axis:
    axis = partial(Axis, "cache_format", sv, tv)
    if sv == tv:
        return axis("same", "inject builds the target's own cache type")
    if sv.startswith("dynamic") and tv.startswith("dynamic"):
        return axis(
            "same",
            "both dynamic: inject builds the target's DynamicCache, trimming sliding layers to its"
            " window (see attention)",
        )
    parts = []
    if sv.startswith("quantized"):
        parts.append(
            "source generate() caches quantized keys (only part stored): extract with a plain"
            " DynamicCache at full precision instead"
        )
    if tv.startswith("quantized"):
        parts.append("inject a full-precision DynamicCache; the target quantizes what it appends")
    if tv.startswith("static"):
        parts.append(
            "a static target cache is zero-padded to its max length: inject into a DynamicCache"
            " or copy into the first tokens"
        )
    if not parts:
        parts.append("inject builds the target's cache from the canonical state (full history kept)")
    return axis("mappable", "; ".join(parts))


def _tokenizer_axis(s_tok, t_tok, same_model: bool) -> Axis:
    from kvbridge.check.tokenizer_fp import compare

    sv = s_tok.short() if s_tok is not None else "unknown"
    tv = t_tok.short() if t_tok is not None else "unknown"
    axis = partial(Axis, "tokenizer", sv, tv)
    if s_tok is not None and t_tok is not None:
        return axis(*compare(s_tok, t_tok))
    if same_model:
        return axis("same", "same model reference: same tokenizer")
    missing = "both sides" if s_tok is None and t_tok is None else ("source" if s_tok is None else "target")
    return axis(
        "mappable",
        f"no tokenizer files for {missing}: verify that the target tokenises the text to the same"
        " ids before a token-aligned transfer (pass --source-tokenizer / --target-tokenizer)",
    )


def _arch_config(config: Mapping, positional_too: bool, other: Mapping) -> dict:
    """Config fields that change the weights (only keys both configs state: a manifest record
    carries the geometry fields only, and an absent key's default is the family's business)."""
    skip = NON_ARCH_KEYS | (POSITION_KEYS if positional_too else frozenset())
    return {k: v for k, v in config.items() if k not in skip and k in other}


SPEC_ARCH_FIELDS = (
    "model_type",
    "num_layers",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "hidden_size",
    "qk_norm",
    "vocab_size",
)


def _model_axis(source, target, same_ref: bool) -> Axis:
    """``source``, ``target``: the two :class:`~kvbridge.check.compat.Side` (spec, name, config, weights digest)."""
    s, t, s_cfg, t_cfg = source.spec, target.spec, source.config, target.config
    axis = partial(Axis, "model", source.name or s.model_type, target.name or t.model_type)
    if same_ref:
        return axis("same", "same model: its cache is the target's own cache")
    arch_diff = [name for name in SPEC_ARCH_FIELDS if getattr(s, name) != getattr(t, name)]
    if s_cfg is not None and t_cfg is not None:
        if (
            _arch_config(s_cfg, False, t_cfg) == _arch_config(t_cfg, False, s_cfg)
            and not arch_diff
            and {**s.to_dict(), "dtype": None} == {**t.to_dict(), "dtype": None}
        ):
            if source.weights and target.weights and source.weights == target.weights:
                return axis("same", "same config and the same weight files: its cache is the target's own cache")
            if source.weights and target.weights:
                return axis(
                    "mappable",
                    "same architecture, different weights (a fine-tune or another seed): the cache can be"
                    " reused as is (`kvbridge eval --mapping identity` measures that), but a fitted"
                    " mapping usually does better (kvbridge fit)",
                )
            return axis(
                "same",
                "same config (weights are not compared: a fine-tune with this config reuses the"
                " cache directly, with quality measured rather than guaranteed)",
            )
        if _arch_config(s_cfg, True, t_cfg) == _arch_config(t_cfg, True, s_cfg) and not arch_diff:
            return axis("same", "same architecture; only position / window settings differ (see rope, attention)")
        diff = sorted(k for k in _arch_config(s_cfg, True, t_cfg) if s_cfg.get(k) != t_cfg.get(k))
        diff += [n for n in arch_diff if n not in diff]
        shown = ", ".join(diff[:4]) + (" ..." if len(diff) > 4 else "")
    else:
        if not arch_diff:
            return axis("same", "same KV geometry and architecture fields (configs not compared)")
        shown = ", ".join(arch_diff)
    cross = " across families" if s.model_type != t.model_type else ""
    return axis(
        "mappable",
        f"different models{cross} (differ in {shown}): their K/V live in different spaces, so a"
        " fitted mapping is needed even where shapes agree",
    )


def core_axes(source, target, same_model: bool) -> list[Axis]:
    """The core rows of a check in :data:`~kvbridge.check.report.AXES` order (the sparse-attention indexer
    keys before cache_format when a side caches them); ``source``, ``target``: the two
    :class:`~kvbridge.check.compat.Side`."""
    s, t = source.spec, target.spec
    cache = _cache_axis(
        cache_format_of(s, source.config, source.generation), cache_format_of(t, target.config, target.generation)
    )
    axes = [
        _model_axis(source, target, same_model),
        _layers_axis(s, t),
        _kv_heads_axis(s, t),
        _head_dim_axis(s, t),
        _positional_axis(s, t),
        _rope_axis(s, t),
        _attention_axis(s, t),
        _dtype_axis(s, t),
        layout_axis(s, t, cache, same_model),
        _tokenizer_axis(source.tokenizer, target.tokenizer, same_model),
    ]
    if s.indexer_layers or t.indexer_layers:
        axes.insert(7, _indexer_axis(s, t, axes[0].verdict == "same"))
    return axes
