"""Steering methods: what a method receives (:class:`SteerContext`), what it returns
(:class:`SteerPlan`), and the built-in methods (registered by ``kvbridge.builtin.steering``).

A method is a class with ``name``, ``Options`` (a frozen dataclass; ``-o key=value`` fills it,
as for fitters) and ``plan(context, options) -> SteerPlan``. The plan is an edited prefix state
(``approximate=True`` whenever the method touched it) and/or ``hooks``: a callable
``hooks(model) -> context manager`` active while the live prompt is prefilled and while every new
token is decoded (for methods that act on the forward pass instead of the cache). ``neutral`` (a
class attribute) names options under which the method must change nothing: the run is then
bitwise the unsteered one (checked by :class:`kvbridge.testing.SteeringMethodContract`).

Built-ins:

- ``kv-vector``: add ``ck`` x the key direction, ``cv`` x the value direction of a steering vector
  at the edited positions (one shot, KV cache steering);
- ``kv-scale``: multiply keys by ``ck`` and values by ``cv``;
- ``kv-mix``: ``(1 - alpha) * own + alpha * other`` with another prompt's cache (``alpha=1``:
  replacement);
- ``kv-bank``: the edited positions (a guide: a text-derived KV bank) stay visible only at the
  chosen layers and are masked out of attention at every other layer (Memory Inception's shape;
  the mask is :class:`kvbridge.prefix.ablate.GuideMask`);
- ``actadd``: residual-stream activation addition with the vector's residual directions (forward
  hooks on the chosen decoder layers, every position, every step): the baseline, not a cache edit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable

from kvbridge.errors import KVBridgeError
from kvbridge.prefix.ablate import GuideMask
from kvbridge.steer.edit import add_vector, coefficient, mix_kv, scale_kv
from kvbridge.steer.hooks import ActivationAddition


@dataclass(frozen=True)
class SteerContext:
    """What a steering method works on (every field read-only; never modify ``state``)."""

    model: Any
    spec: Any  # ModelSpec
    state: Any  # KVState: the unsteered prefix cache (batch 1)
    start: int  # edited cache positions start:stop
    stop: int
    layers: tuple  # chosen layers
    vector: Any = None  # SteeringVector (kv-vector, actadd)
    other: Any = None  # KVState of another prompt (kv-mix)
    meta: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class SteerPlan:
    """A method's answer: the prefix state to continue from, and hooks active during the run."""

    state: Any
    hooks: Callable[[Any], Any] | None = None
    record: dict = field(default_factory=dict)


def _need(ctx: SteerContext, attr: str, method: str, fix: str):
    value = getattr(ctx, attr)
    if value is None:
        raise KVBridgeError(f"steering method {method!r} needs {attr}", fix)
    return value


@dataclass(frozen=True)
class VectorOptions:
    ck: float = 0.0
    cv: float = 1.0


class VectorMethod:
    """Add a steering vector's K/V directions to the cache (one shot)."""

    name = "kv-vector"
    Options = VectorOptions
    neutral = {"ck": 0.0, "cv": 0.0}

    def plan(self, ctx: SteerContext, options: VectorOptions) -> SteerPlan:
        vector = _need(ctx, "vector", self.name, "pass --vector DIR")
        state = add_vector(
            ctx.state, vector, ck=options.ck, cv=options.cv, layers=ctx.layers, start=ctx.start, stop=ctx.stop
        )
        return SteerPlan(state, None, {"method": self.name, "ck": options.ck, "cv": options.cv})


@dataclass(frozen=True)
class ScaleOptions:
    ck: float = 1.0
    cv: float = 1.0


class ScaleMethod:
    """Scale cached keys and values."""

    name = "kv-scale"
    Options = ScaleOptions
    neutral = {"ck": 1.0, "cv": 1.0}

    def plan(self, ctx: SteerContext, options: ScaleOptions) -> SteerPlan:
        state = scale_kv(ctx.state, ck=options.ck, cv=options.cv, layers=ctx.layers, start=ctx.start, stop=ctx.stop)
        return SteerPlan(state, None, {"method": self.name, "ck": options.ck, "cv": options.cv})


@dataclass(frozen=True)
class MixOptions:
    alpha: float = 1.0


class MixMethod:
    """Mix (or replace, alpha=1) the cache with another prompt's over a layer range."""

    name = "kv-mix"
    Options = MixOptions
    neutral = {"alpha": 0.0}

    def plan(self, ctx: SteerContext, options: MixOptions) -> SteerPlan:
        other = _need(ctx, "other", self.name, "pass --other TEXT (the prompt whose cache is mixed in)")
        state = mix_kv(ctx.state, other, alpha=options.alpha, layers=ctx.layers, start=ctx.start, stop=ctx.stop)
        return SteerPlan(state, None, {"method": self.name, "alpha": options.alpha})


@dataclass(frozen=True)
class BankOptions:
    pass


class BankMethod:
    """A layer-selective KV bank: the edited positions visible only at the chosen layers."""

    name = "kv-bank"
    Options = BankOptions
    neutral: dict = {}  # with every layer chosen nothing is masked

    def plan(self, ctx: SteerContext, options: BankOptions) -> SteerPlan:
        masked = tuple(i for i in range(ctx.spec.num_layers) if i not in set(ctx.layers))
        record = {
            "method": self.name,
            "visible_layers": list(ctx.layers),
            "masked_layers": list(masked),
            "positions": [ctx.start, ctx.stop],
        }
        if not masked:
            return SteerPlan(ctx.state, None, record)
        # hooks(model): a context manager, the mask's hooks (removed on exit)
        hooks = partial(GuideMask, layers=masked, start=ctx.start, stop=ctx.stop, active=True)
        steered = list(ctx.state.meta.get("steered", ()))
        state = replace(ctx.state, approximate=True, meta={**ctx.state.meta, "steered": steered + [record]})
        return SteerPlan(state, hooks, record)


@dataclass(frozen=True)
class ActAddOptions:
    coefficient: float = 4.0


class ActAddMethod:
    """Residual-stream activation addition (forward hooks), from the vector's residual directions."""

    name = "actadd"
    Options = ActAddOptions
    neutral = {"coefficient": 0.0}

    def plan(self, ctx: SteerContext, options: ActAddOptions) -> SteerPlan:
        vector = _need(ctx, "vector", self.name, "pass --vector DIR")
        if not vector.residual:
            raise KVBridgeError(
                "this steering vector has no residual directions (a transferred vector carries K/V only)",
                "build the vector on this model for activation addition",
            )
        c = coefficient(options.coefficient, "actadd coefficient")
        directions = {i: vector.residual[i] for i in ctx.layers}
        # hooks(model): a context manager, the hooks (removed on exit)
        hooks = partial(ActivationAddition, directions=directions, coefficient=c, layers=ctx.layers)
        return SteerPlan(ctx.state, hooks, {"method": self.name, "coefficient": c, "layers": list(ctx.layers)})


BUILTIN_METHODS = (VectorMethod, ScaleMethod, MixMethod, BankMethod, ActAddMethod)

from kvbridge.plugin_types import method_problem  # noqa: E402  (the protocol lives with the record type)


def method_options(method, values: dict | None = None):
    from kvbridge.fit.protocol import build_options

    return build_options(method.Options, values or {}, owner=f"steering method {method.name!r}")


__all__ = [
    "SteerContext",
    "SteerPlan",
    "VectorMethod",
    "ScaleMethod",
    "MixMethod",
    "BankMethod",
    "ActAddMethod",
    "BUILTIN_METHODS",
    "method_problem",
    "method_options",
]
