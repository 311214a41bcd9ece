"""The guarded hand-off: check a transferred cache on live input before the target uses it.

:func:`guarded_prepare` runs, on the state about to be handed to ``generate``:

1. ``finite``: every K and V value is finite;
2. ``magnitude``: per layer, the RMS of the state's K and of its V are within a factor
   ``max_ratio`` (default 4) of the target's own (:class:`TargetStats`, measured once from the
   target's prefill of reference text; without stats, from a prefill of the first
   ``stats_tokens`` prompt tokens, which costs that small prefill on every call);
3. ``kl_probe`` (optional, off by default: it costs one full target prefill of the prompt, so it
   is meant for sampled audits): KL(native ‖ transferred) of the next-token distribution after
   the prompt must be at most ``kl_max`` (default 0.2).

When a check fails, the hand-off **falls back to the target's own prefill** of the cached
tokens, visibly: a :class:`GuardFallbackWarning` is emitted (and ``on_fallback`` is called),
and the returned :class:`GuardedHandoff` says ``used == "target_prefill"`` with the reasons.
It never falls back silently; ``strict=True`` raises :class:`GuardError` instead.

A transferred cache is always marked approximate (``state.approximate``): the hand-off keeps
that flag (and sets it on any state that the target did not produce itself), so a caller can
never publish it as the target's exact prefix cache.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any

from kvbridge.errors import KVBridgeError, StateError
from kvbridge.plugins import adapter_of


class GuardError(KVBridgeError):
    """A transferred cache failed the guard and ``strict=True`` forbade the fallback."""


class GuardFallbackWarning(UserWarning):
    """The guard rejected a transferred cache; the target's own prefill is used instead."""


@dataclass(frozen=True)
class TargetStats:
    """Per-layer RMS of the target's own cached K and V."""

    k_rms: tuple
    v_rms: tuple
    tokens: int = 0

    @classmethod
    def from_state(cls, state) -> "TargetStats":
        rms = lambda t: float(t.float().pow(2).mean().sqrt())
        return cls(tuple(rms(k) for k in state.keys), tuple(rms(v) for v in state.values), state.num_tokens)

    @classmethod
    def from_model(cls, model, input_ids, host=None) -> "TargetStats":
        """From the target's own prefill of ``input_ids`` (reference text)."""
        return cls.from_state(adapter_of(model, host).extract(model, input_ids))

    def to_dict(self) -> dict:
        return {"k_rms": list(self.k_rms), "v_rms": list(self.v_rms), "tokens": self.tokens}

    @classmethod
    def from_dict(cls, d: dict) -> "TargetStats":
        return cls(tuple(d["k_rms"]), tuple(d["v_rms"]), int(d.get("tokens", 0)))


@dataclass(frozen=True)
class GuardCheck:
    name: str
    passed: bool
    value: Any = None
    limit: Any = None
    detail: str = ""


@dataclass
class GuardedHandoff:
    """What :func:`guarded_prepare` decided, and the cache to give ``generate``."""

    cache: Any
    input_ids: Any
    state: Any  # the state the cache holds (transferred, or the target's own on fallback)
    used: str  # "transferred" or "target_prefill"
    approximate: bool
    checks: list = field(default_factory=list)
    reasons: list = field(default_factory=list)

    @property
    def fell_back(self) -> bool:
        return self.used == "target_prefill"

    def summary(self) -> str:
        checks = ", ".join(f"{c.name} {'ok' if c.passed else 'FAILED'}" for c in self.checks)
        what = "transferred cache (approximate)" if self.used == "transferred" else "target's own prefill (exact)"
        tail = f"; fell back: {'; '.join(self.reasons)}" if self.reasons else ""
        return f"guard: using the {what}; checks: {checks}{tail}"


def check_finite(state) -> GuardCheck:
    import torch

    bad = sum(int((~torch.isfinite(t)).sum()) for t in (*state.keys, *state.values))
    return GuardCheck("finite", bad == 0, bad, 0, f"{bad} NaN/inf values" if bad else "")


def check_magnitude(state, stats: TargetStats, max_ratio: float = 4.0) -> GuardCheck:
    import math

    got = TargetStats.from_state(state)
    worst, where = 1.0, ""
    if len(got.k_rms) != len(stats.k_rms):
        return GuardCheck(
            "magnitude", False, None, max_ratio, f"state has {len(got.k_rms)} layers, target stats {len(stats.k_rms)}"
        )
    for kind, have, want in (("K", got.k_rms, stats.k_rms), ("V", got.v_rms, stats.v_rms)):
        for layer, (h, w) in enumerate(zip(have, want)):
            ratio = (h / w) if w > 0 else math.inf
            r = max(ratio, 1 / ratio) if ratio > 0 else math.inf
            if not math.isfinite(r) or r > worst:
                worst, where = r, f"layer {layer} {kind} RMS {h:.4g} vs target {w:.4g}"
    return GuardCheck("magnitude", worst <= max_ratio, worst, max_ratio, where)


def _next_logits(model, cache, ids):
    import torch

    with torch.no_grad():
        kwargs = {"cache": cache, "use_cache": True} if cache is not None else {}
        return model(input_ids=ids, **kwargs).logits[:, -1].float()


@dataclass(frozen=True)
class GuardSettings:
    """The guard's limits: ``max_ratio`` (magnitude), ``stats_tokens`` (prompt tokens prefilled for the
    target's stats when none are given), ``kl_probe`` / ``kl_max`` (the optional next-token KL check),
    ``strict`` (raise :class:`GuardError` instead of falling back)."""

    max_ratio: float = 4.0
    stats_tokens: int = 16
    kl_probe: bool = False
    kl_max: float = 0.2
    strict: bool = False


def guarded_prepare(
    model, state, input_ids, settings=None, *, stats=None, on_fallback=None, host=None
) -> GuardedHandoff:
    """Check ``state`` for ``model`` and return the cache to ``generate`` from (see the module docstring)."""
    import torch

    from kvbridge.divergence import kl as kl_of
    from kvbridge.handoff import prepare_cache
    from kvbridge.models.fingerprint import config_fingerprint

    g = settings if settings is not None else GuardSettings()
    adapter = adapter_of(model, host)
    ids = torch.as_tensor(input_ids)
    ids = ids[None] if ids.dim() == 1 else ids
    n = state.num_tokens
    own = config_fingerprint(model.config.to_dict())
    if state.model_fingerprint != own or getattr(state, "approximate", False):
        state = replace(state, approximate=True)
    checks = [check_finite(state)]
    native_full = None
    if checks[0].passed:
        try:
            state.validate(adapter.spec_of(model), check_finite=False, what="transferred state")
            checks.append(GuardCheck("geometry", True))
        except StateError as exc:
            checks.append(GuardCheck("geometry", False, detail=exc.what))
    if all(c.passed for c in checks):
        if stats is None:
            stats = TargetStats.from_model(model, ids[:, : max(1, min(g.stats_tokens, n))], host=host)
        checks.append(check_magnitude(state, stats, g.max_ratio))
    if g.kl_probe and all(c.passed for c in checks):
        cache, rest = prepare_cache(model, state, ids, host=host)
        native_full = adapter.extract(model, ids[:, :n])
        ref = _next_logits(model, None, ids)
        got = _next_logits(model, cache, rest[:, n - 1 if n == ids.shape[1] else n :]) if cache is not None else ref
        kl = float(kl_of(ref, got).max())
        checks.append(GuardCheck("kl_probe", kl <= g.kl_max, kl, g.kl_max, f"next-token KL {kl:.4g}"))
    failed = [c for c in checks if not c.passed]
    if not failed:
        cache, out_ids = prepare_cache(model, state, ids, host=host)
        return GuardedHandoff(cache, out_ids, state, "transferred", bool(state.approximate), checks)
    reasons = [f"{c.name}: {c.detail or c.value}" for c in failed]
    if g.strict:
        raise GuardError(
            f"transferred cache rejected ({'; '.join(reasons)})",
            "fix the mapping, or allow the fallback to the target's own prefill (strict=False)",
        )
    own_state = native_full if native_full is not None else adapter.extract(model, ids[:, :n])
    cache, out_ids = prepare_cache(model, own_state, ids, host=host)
    handoff = GuardedHandoff(cache, out_ids, own_state, "target_prefill", False, checks, reasons)
    warnings.warn(
        f"kvbridge guard: transferred cache rejected ({'; '.join(reasons)}); using the target's own prefill instead",
        GuardFallbackWarning,
        stacklevel=2,
    )
    if on_fallback is not None:
        on_fallback(handoff)
    return handoff


def guarded_generate(model, state, input_ids, *, guard=None, host=None, **generate_kwargs):
    """``(output_ids, handoff)``: ``model.generate`` from a guarded hand-off of ``state``; ``guard``: a
    :class:`GuardSettings`, or a dict of its fields plus ``stats`` / ``on_fallback``."""
    from kvbridge.handoff import generate_from

    kw = dict(guard) if isinstance(guard, dict) else {"settings": guard}
    extra = {k: kw.pop(k) for k in ("settings", "stats", "on_fallback") if k in kw}
    extra.setdefault("settings", GuardSettings(**kw))
    handoff = guarded_prepare(model, state, input_ids, host=host, **extra)
    return generate_from(model, handoff.cache, handoff.input_ids, **generate_kwargs), handoff
