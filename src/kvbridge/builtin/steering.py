"""Built-in steering methods and behaviour scorers, as one plugin (imports nothing heavy).

The methods are the classes of :mod:`kvbridge.steer.methods` (``kv-vector``, ``kv-scale``,
``kv-mix``, ``kv-bank``, ``actadd``); the scorers the functions of :mod:`kvbridge.steer.scorers`.
Each is loaded by its ``"module:attr"`` path only when ``kvbridge steer`` uses it.
"""

from __future__ import annotations

from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Scorer, SteeringMethod
from kvbridge.steer.scorers import BUILTIN_SCORERS

METHODS = (
    SteeringMethod(
        "kv-vector",
        "add ck x the key and cv x the value direction of a steering vector to the cache "
        "(one shot; keys rotated to each edited position)",
        "kvbridge.steer.methods:VectorMethod",
    ),
    SteeringMethod("kv-scale", "multiply cached keys by ck and values by cv", "kvbridge.steer.methods:ScaleMethod"),
    SteeringMethod(
        "kv-mix",
        "(1 - alpha) x own + alpha x another prompt's cache (alpha=1: replacement)",
        "kvbridge.steer.methods:MixMethod",
    ),
    SteeringMethod(
        "kv-bank",
        "layer-selective KV bank: the guide visible only at the chosen layers, masked elsewhere",
        "kvbridge.steer.methods:BankMethod",
    ),
    SteeringMethod(
        "actadd",
        "residual-stream activation addition (forward hooks, every position and step): the baseline, not a cache edit",
        "kvbridge.steer.methods:ActAddMethod",
    ),
)
SCORERS = tuple(Scorer(name, description, factory) for name, description, factory in BUILTIN_SCORERS)


@hookimpl
def kvbridge_register_steering_methods(register):
    for method in METHODS:
        register(method)


@hookimpl
def kvbridge_register_scorers(register):
    for scorer in SCORERS:
        register(scorer)
