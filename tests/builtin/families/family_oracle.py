"""Helpers of the built-in family tests (imported by the test modules).

The adapters and their tiny configs, and an oracle that reads the same facts a ModelSpec
states from the transformers config object, after transformers' own normalisation.
"""

from __future__ import annotations

import copy
import json
import logging

from kvbridge.builtin.families import builtin_adapters

ADAPTERS = {a.name: a for a in builtin_adapters()}
TINY = [(name, variant) for name, a in ADAPTERS.items() for variant in a.tiny_configs()]
TINY_IDS = [f"{n}-{v}" for n, v in TINY]
#: families whose attention uses hidden_size // heads whatever the config's head_dim says
DERIVED_HEAD_DIM = {"stablelm", "gpt_neox", "gpt2", "gptj", "falcon"}
#: families whose model rotates only the first partial_rotary_factor of each head
PARTIAL_ROTARY = {"phi", "phi3", "stablelm", "gpt_neox"}
ROPE_META = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}


def tiny(name: str, variant: str) -> dict:
    return copy.deepcopy(ADAPTERS[name].tiny_configs()[variant])


def hf_config(config: dict):
    """The transformers config object of a mapping (on a deep copy: transformers mutates dicts)."""
    from transformers import AutoConfig

    data = copy.deepcopy(dict(config))
    model_type = data.pop("model_type")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return AutoConfig.for_model(model_type, **data)


def _scaling(params: dict) -> dict:
    return {k: v for k, v in params.items() if k not in ROPE_META and v is not None}


def hf_expected(hf) -> dict:
    """What a ModelSpec must say, read from the transformers config object alone."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    mt = hf.model_type
    heads, hidden = hf.num_attention_heads, hf.hidden_size
    head_dim = hidden // heads if mt in DERIVED_HEAD_DIM else (getattr(hf, "head_dim", None) or hidden // heads)
    if mt == "falcon":
        kv = heads if hf.new_decoder_architecture else (1 if hf.multi_query else hf.num_kv_heads)
    elif mt in ("gpt2", "gptj", "gpt_neox"):
        kv = heads
    else:
        kv = hf.num_key_value_heads
    dtype = str(hf.dtype).removeprefix("torch.") if hf.dtype is not None else "float32"
    out = {
        "model_type": mt,
        "num_layers": hf.num_hidden_layers,
        "num_attention_heads": heads,
        "num_kv_heads": kv,
        "head_dim": head_dim,
        "hidden_size": hidden,
        "vocab_size": hf.vocab_size,
        "max_position_embeddings": hf.max_position_embeddings,
        "dtype": dtype,
        "sliding_window": getattr(hf, "sliding_window", None),
        "layer_types": list(get_layer_types_and_kwargs(hf)[0]),
    }
    qk = {
        "qwen3": True,
        "olmo2": True,
        "gemma3_text": True,
        "phi": getattr(hf, "qk_layernorm", False),
        "stablelm": getattr(hf, "qk_layernorm", False),
        "cohere": getattr(hf, "use_qk_norm", False),
    }
    out["qk_norm"] = bool(qk.get(mt, False))
    if mt == "gpt2":
        out["positional"], out["rope"] = "absolute", None
    elif mt == "falcon" and hf.alibi:
        out["positional"], out["rope"] = "alibi", None
    elif mt == "gptj":
        out["positional"] = "rope"
        out["rope"] = {
            "type": "default",
            "theta": 10000.0,
            "rotary_dim": hf.rotary_dim or head_dim,
            "interleaved": True,
            "scaling": {},
            "head_dim": head_dim,
            "max_position_embeddings": hf.max_position_embeddings,
        }
    else:
        out["positional"] = "rope"
        tables = hf.rope_parameters
        if mt == "gemma3_text":
            out["rope_by_layer_type"] = {
                k: _rope_expect(mt, tables[k], head_dim, hf) for k in ("full_attention", "sliding_attention")
            }
            tables = tables["full_attention"]
        out["rope"] = _rope_expect(mt, tables, head_dim, hf)
    return out


def _rope_expect(mt: str, params: dict, head_dim: int, hf) -> dict:
    partial = params.get("partial_rotary_factor", 1.0) if mt in PARTIAL_ROTARY else 1.0
    return {
        "type": params["rope_type"],
        "theta": float(params["rope_theta"]),
        "rotary_dim": int(head_dim * partial) - int(head_dim * partial) % 2,
        "interleaved": mt in ("cohere", "gptj"),
        "scaling": _scaling(params),
        "head_dim": head_dim,
        "max_position_embeddings": hf.max_position_embeddings,
    }


def _rope_actual(rope) -> dict:
    d = rope.to_dict()
    return {
        k: d[k]
        for k in ("type", "theta", "rotary_dim", "interleaved", "scaling", "head_dim", "max_position_embeddings")
    }


def spec_view(spec) -> dict:
    """The fields of a spec that ``hf_expected`` predicts, in the same shape."""
    out = {
        "model_type": spec.model_type,
        "num_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_size": spec.hidden_size,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "dtype": spec.dtype,
        "sliding_window": spec.sliding_window,
        "layer_types": list(spec.layer_types),
        "qk_norm": spec.qk_norm,
        "positional": spec.positional,
        "rope": _rope_actual(spec.rope) if spec.rope else None,
    }
    if spec.rope_by_layer_type:
        out["rope_by_layer_type"] = {k: _rope_actual(v) for k, v in spec.rope_by_layer_type}
    return out


def assert_agrees_with_hf(spec, hf) -> None:
    want, got = hf_expected(hf), spec_view(spec)
    # JSON round trip: ints vs floats inside lists compare by value, tuples become lists
    want, got = json.loads(json.dumps(want)), json.loads(json.dumps(got))
    diff = {k: (got.get(k), want[k]) for k in want if got.get(k) != want[k]}
    assert not diff, f"describe() disagrees with transformers (got, want): {diff}"
