"""Per-layer differences between two caches that a transfer must respect (used by ``compat``).

- :func:`nope_note`: which layers carry no RoPE on each side (strip/apply skip them);
- :func:`layout_axis`: the ``cache_format`` axis raised for layouts a fitted mapping cannot
  produce: an MLA latent cache, or recurrent / convolution state of hybrid models (attention
  layers of a hybrid source still map; a hybrid target's recurrent state cannot be mapped).
"""

from __future__ import annotations

from kvbridge.spec import ModelSpec


def nope_note(s: ModelSpec, t: ModelSpec) -> str:
    """Which layers carry no RoPE on each side, when that differs ("" when it does not)."""
    if s.nope_layers == t.nope_layers:
        return ""

    def fmt(spec):
        return f"layers {list(spec.nope_layers)}" if spec.nope_layers else "none"

    only_s = sorted(set(s.nope_layers) - set(t.nope_layers))
    only_t = sorted(set(t.nope_layers) - set(s.nope_layers))
    bits = [f"NoPE layers differ (source {fmt(s)}, target {fmt(t)}): strip/apply skip each side's NoPE layers"]
    if only_s:
        bits.append(f"layers {only_s} are NoPE only in the source (their keys get the target RoPE)")
    if only_t:
        bits.append(f"layers {only_t} are NoPE only in the target (their keys lose the source RoPE)")
    return "; ".join(bits)


def layout_axis(s: ModelSpec, t: ModelSpec, axis, same_model: bool):
    """The cache_format axis raised for MLA and recurrent-state layouts a mapping cannot produce."""
    same_layout = all(getattr(s, f) == getattr(t, f) for f in ("cache_format", "num_layers", "state_layers", "latent"))
    if s.cache_format == "kv" and t.cache_format == "kv" or same_layout and (same_model or s == t):
        return axis
    parts, verdict = [], axis.verdict
    for side, spec in (("source", s), ("target", t)):
        if spec.cache_format == "mla":
            sizes = dict(spec.latent)
            parts.append(
                f"{side} uses MLA: its cache holds the compressed latent (rank {sizes.get('kv_lora_rank')},"
                f" position-free) and one shared RoPE key of {sizes.get('qk_rope_head_dim')} dims per token,"
                " not per-head K/V; fitting another model's cache onto this latent is not supported"
            )
            verdict = "blocking"
    if t.cache_format == "hybrid" and not same_layout:
        parts.append(
            f"target layers {list(t.state_layers)} hold recurrent/convolution state that only the target"
            " itself can compute from the tokens: it cannot be mapped from another model"
        )
        verdict = "blocking"
    elif s.cache_format == "hybrid" and not same_layout:
        parts.append(
            f"source recurrent/convolution state (layers {list(s.state_layers)}) is dropped; only its"
            f" attention layers {list(s.kv_layers)} map"
        )
        verdict = "blocking" if verdict == "blocking" else "mappable"
    if not parts:
        return axis
    return type(axis)(
        "cache_format",
        f"{axis.source} ({s.cache_format})",
        f"{axis.target} ({t.cache_format})",
        verdict,
        "; ".join(parts),
    )
