"""The records plugins register or return, and the protocols the host checks them against.

Everything here is torch-free (``kvbridge plugins`` stays fast). The hooks that take these
are documented in :mod:`kvbridge.hookspecs` and ``docs/plugins.md``:

- :class:`Finding` (``kvbridge_check_compatibility``),
- :class:`RopeVariant` (``kvbridge_register_rope_variants``),
- :class:`Fitter`, a lazy record of a class following :class:`kvbridge.fit.protocol.FitterProtocol`
  (``kvbridge_register_fitters``),
- :class:`Metric`, a lazy record of a function following :class:`MetricFunction`
  (``kvbridge_register_metrics``),
- :class:`ModelSource`, a reference scheme ``NAME:REST`` (``kvbridge_register_model_sources``),
- :class:`Task`, a lazy record of a harness task class following
  :class:`kvbridge.harness.protocol.TaskProtocol` (``kvbridge_register_tasks``),
- :class:`Engine`, a lazy record of an object following :class:`EngineProtocol`
  (``kvbridge_register_engines``),
- :class:`SteeringMethod`, a lazy record of a class following the steering-method protocol
  (``kvbridge_register_steering_methods``; :mod:`kvbridge.steer.methods`),
- :class:`Scorer`, a lazy record of a function ``text -> bool`` (``kvbridge_register_scorers``).

:func:`check_registration` is what the host runs on every registered object: an object that
does not follow its protocol is refused with a one-line error naming the plugin and the
missing member (``kvbridge plugins`` shows it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, is_dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from kvbridge.errors import ConfigError, PluginError

if TYPE_CHECKING:  # pragma: no cover
    from kvbridge.spec import RopeSpec

VERDICTS = ("same", "mappable", "blocking", "info", "warning")
#: a model-source scheme name (``myhub`` in ``myhub:REST``)
SCHEME_RE = __import__("re").compile(r"^[a-z][a-z0-9_.+-]*$")


@runtime_checkable
class FamilyAdapterProtocol(Protocol):
    """What the host asks of a registered family adapter (the base class with the model side is
    :class:`kvbridge.family_adapter.FamilyAdapter`, a layer above this one)."""

    name: str
    model_types: tuple

    def describe(self, config: Any) -> Any: ...


@dataclass(frozen=True)
class ModelSource:
    """A reference scheme: ``resolver(rest)`` turns ``NAME:REST`` into a local path or a ModelRef."""

    name: str
    resolver: Callable[[str], Any]
    description: str = ""
    plugin: str = "kvbridge"


@dataclass(frozen=True)
class Finding:
    """One line of a compatibility report, from the core checks or a plugin."""

    axis: str  # "layers", "kv_heads", ... or a plugin's own axis name
    verdict: str  # one of VERDICTS
    message: str  # what a transfer must do about it
    source_value: Any = None
    target_value: Any = None
    plugin: str = ""  # filled in by the host


def load_object(path: str) -> Any:
    """Import ``"package.module:attr"`` lazily."""
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class LazyFactory:
    """Base of the records whose ``factory`` is an object or its ``"module:attr"`` path, imported by
    :meth:`load` when first used (registration stays cheap); each kind's record is a subclass."""

    name: str
    description: str
    factory: Any

    def load(self) -> Any:
        return load_object(self.factory) if isinstance(self.factory, str) else self.factory


# -- RoPE variants -----------------------------------------------------------------------------
class RopeError(ConfigError):
    """A RoPE spec kvbridge cannot turn into a table (missing or malformed parameters)."""


class UnknownRopeTypeError(RopeError):
    """No built-in or plugin RoPE variant handles this ``rope_type``."""


@dataclass(frozen=True)
class RopeVariant:
    """One ``rope_type``: how its inverse frequencies follow from a :class:`~kvbridge.spec.RopeSpec`.

    ``inv_freq(rope, seq_len)`` (or ``inv_freq(rope, seq_len, device)``) returns
    ``(inv_freq, attention_scaling)``: ``rope.rotary_dim // 2`` inverse frequencies (a float32
    tensor, or anything ``torch.as_tensor`` takes) and the factor the cos/sin tables are
    multiplied by. ``seq_len`` is the length of the forward the table is for (``None``: the
    static table the model builds at init). kvbridge calls it on the CPU and moves the result,
    as transformers computes the tables of a loaded model on the CPU.

    Optional: ``stateful`` marks a type whose table depends on the forward length (besides
    the built-in ``dynamic`` and ``longrope``); ``table_length(rope, seq_len)`` maps a forward
    length to a representative one with the same table (``None``: the static table), which
    lets the codec group keys of many lengths into few tables.
    """

    name: str
    inv_freq: Callable[..., tuple]
    description: str = ""
    stateful: bool = False
    table_length: "Callable[[RopeSpec, int], int | None] | None" = None


# -- fitters -----------------------------------------------------------------------------------
class Fitter(LazyFactory):
    """A mapping fitter: ``factory`` is a class following
    :class:`kvbridge.fit.protocol.FitterProtocol`, or its ``"module:attr"`` path (loaded lazily
    when the fitter is used, so registration stays cheap)."""


# -- metrics -----------------------------------------------------------------------------------
@runtime_checkable
class MetricFunction(Protocol):
    """``metric(view) -> values``: ``view`` is a :class:`kvbridge.evaluate.metrics.EvalView`
    (per-sample arrays with a leading replicate dimension ``R``); the result is ``R`` numbers
    (a tensor) or one number. ``nan`` where the metric does not apply; any exception is an
    error naming the metric and its plugin."""

    def __call__(self, view: Any) -> Any: ...


@dataclass(frozen=True)
class Metric(LazyFactory):
    """A quality metric: ``factory`` is a :class:`MetricFunction` or its ``"module:attr"`` path."""

    higher_is_better: bool = False


# -- engines -----------------------------------------------------------------------------------
@runtime_checkable
class EngineProtocol(Protocol):
    """An inference engine's cache format: ``export_state(state, model, out=None, **options) -> bytes``
    writes a :class:`kvbridge.kvstate.KVState` as the engine loads it (to ``out`` when given, atomically);
    ``import_state(src, model, **options) -> KVState`` reads a cache the engine saved (bytes or a path).
    ``model`` names the model the engine runs (for llama.cpp its ``.gguf``); both refuse a state
    or file whose geometry is not the model's with a one-line error."""

    name: str

    def export_state(self, state: Any, model: Any, out: Any = None, **options: Any) -> bytes: ...

    def import_state(self, src: Any, model: Any, **options: Any) -> Any: ...


#: members an engine object needs (checked when its factory is loaded)
ENGINE_MEMBERS = ("name", "export_state", "import_state")


@dataclass(frozen=True)
class Engine(LazyFactory):
    """An inference engine kvbridge hands caches to and reads caches from: ``factory`` is an
    :class:`EngineProtocol` object or its ``"module:attr"`` path (loaded when the engine is used,
    so registration imports nothing heavy); ``suffix`` is the usual file suffix of its state."""

    suffix: str = ""


# -- steering methods and behaviour scorers ----------------------------------------------------
class SteeringMethod(LazyFactory):
    """A steering method: ``factory`` is a class with ``name``, ``Options`` and ``plan(context,
    options) -> SteerPlan`` (:mod:`kvbridge.steer.methods`), or its ``"module:attr"`` path."""


class Scorer(LazyFactory):
    """A behaviour scorer: ``factory`` is a deterministic function ``text -> bool`` or its ``"module:attr"`` path."""


# -- harness tasks -----------------------------------------------------------------------------
class Task(LazyFactory):
    """A harness task: ``factory`` is a class following
    :class:`kvbridge.harness.protocol.TaskProtocol`, or its ``"module:attr"`` path (loaded lazily)."""


# -- registration checks -----------------------------------------------------------------------
_LAZY = ("name", "description", "factory")
#: per plugin kind: (what a user calls one, the hook that registers it, what a protocol message calls one,
#: members the registered object needs); :data:`kvbridge.plugins.KINDS` is the first two
KIND_TABLE = {
    "family": ("model type", "kvbridge_register_families", "family adapter", ("name", "model_types", "describe")),
    "rope_variant": ("RoPE variant", "kvbridge_register_rope_variants", "RoPE variant", ("name", "inv_freq")),
    "fitter": ("fitter", "kvbridge_register_fitters", "fitter", _LAZY),
    "metric": ("metric", "kvbridge_register_metrics", "metric", _LAZY),
    "engine": ("engine", "kvbridge_register_engines", "engine", _LAZY),
    "steering_method": ("steering method", "kvbridge_register_steering_methods", "steering method", _LAZY),
    "scorer": ("scorer", "kvbridge_register_scorers", "scorer", _LAZY),
    "task": ("task", "kvbridge_register_tasks", "task", _LAZY),
}

#: members a steering-method class needs (:mod:`kvbridge.steer.methods`)
METHOD_MEMBERS = ("name", "Options", "plan")
#: members a fitter class needs (:class:`kvbridge.fit.protocol.FitterProtocol`)
FITTER_MEMBERS = ("name", "Options", "fit")
#: members a harness task class needs (:class:`kvbridge.harness.protocol.TaskProtocol`)
TASK_MEMBERS = ("name", "Options", "items", "score", "chance")


def _class_problem(cls: Any, members: tuple, call: str | None, options_type: bool = True) -> str | None:
    """The first of ``members`` that ``cls`` misses, ``call`` not callable, or ``Options`` not a dataclass."""
    for member in members:
        if not hasattr(cls, member):
            return member
    if call is not None and not callable(getattr(cls, call)):
        return f"{call} (callable)"
    opts = getattr(cls, "Options")
    if not is_dataclass(opts) or (options_type and not isinstance(opts, type)):
        return "Options (a dataclass)"
    return None


def method_problem(cls: Any) -> str | None:
    """The first member a steering-method class misses (None when it follows the protocol)."""
    return _class_problem(cls, METHOD_MEMBERS, "plan")


def fitter_problem(cls: Any) -> str | None:
    """The first missing protocol member of a fitter class (or instance), else None."""
    return _class_problem(cls, FITTER_MEMBERS, "fit")


def task_problem(cls: Any) -> str | None:
    """The first missing member of a task class (or instance), else None."""
    return _class_problem(cls, TASK_MEMBERS, None, options_type=False)


def factory_problem(kind: str, factory: Any) -> str | None:
    """The first member a ``kind``'s factory misses (a fitter, task or steering-method class, an engine
    object; a metric or scorer function must be callable), else None."""
    if kind == "engine":
        return next((m for m in ENGINE_MEMBERS if not hasattr(factory, m)), None)
    check = {"fitter": fitter_problem, "task": task_problem, "steering_method": method_problem}.get(kind)
    if check is not None:
        return check(factory)
    return None if callable(factory) else "__call__"


def protocol_problem(kind: str, obj: Any) -> str | None:
    """The first missing member of ``obj`` as a ``kind`` (an eager factory is checked too), else None."""
    missing = [m for m in KIND_TABLE[kind][3] if not hasattr(obj, m)]
    if missing:
        return missing[0]
    if kind == "rope_variant" and not callable(obj.inv_freq):
        return "inv_freq (callable)"
    if "factory" in KIND_TABLE[kind][3] and not isinstance(obj.factory, str):
        return factory_problem(kind, obj.factory)
    return None


def check_registration(kind: str, obj: Any, plugin: str) -> tuple[Any, str | None]:
    """``(object to register, None)`` or ``(obj, one-line error)`` for an object a plugin registers.

    A fitter class (``name``, ``Options``, ``fit``) registered directly is wrapped in a
    :class:`Fitter` record; so is a steering-method class (``name``, ``Options``, ``plan``) in a
    :class:`SteeringMethod` record.
    """
    record, member = {
        "task": (Task, "items"),
        "fitter": (Fitter, "fit"),
        "steering_method": (SteeringMethod, "plan"),
    }.get(kind, (None, None))
    if record is not None and not isinstance(obj, record) and hasattr(obj, member):
        doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
        obj = record(getattr(obj, "name", ""), doc[0] if doc else "", obj)
    missing = protocol_problem(kind, obj)
    if missing is None:
        return obj, None
    name, word = getattr(obj, "name", None), KIND_TABLE[kind][2]
    what = f"{word} {name!r}" if isinstance(name, str) else f"{word} {type(obj).__name__}"
    return obj, (
        f"plugin {plugin!r}: {what} does not follow the protocol: missing member {missing!r} "
        f"(fix: see docs/plugins.md, {word}s)"
    )


def load_registered(kind: str, name: str, record: Any, plugin: str) -> Any:
    """``record.load()`` checked against its kind's protocol: a factory that cannot be imported (a missing
    module, a missing attribute, an error or ``sys.exit`` in its module) or misses a member is a one-line
    PluginError naming the plugin (and the factory path; exit 2), never an internal error."""
    try:
        obj = record.load()
    except PluginError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever the plugin's module raises
        what = exc.code if isinstance(exc, SystemExit) else " ".join(str(exc).split())
        raise PluginError(
            f"{KIND_TABLE[kind][2]} {name!r} of plugin {plugin or '?'!r}: cannot load its factory "
            f"{getattr(record, 'factory', '?')!r} ({type(exc).__name__}: {str(what)[:160]})",
            f"install what the plugin needs, or skip it with KVBRIDGE_DISABLE_PLUGINS={plugin or 'NAME'}",
        ) from None
    missing = factory_problem(kind, obj)
    if missing:
        raise PluginError(
            f"{KIND_TABLE[kind][2]} {name!r} of plugin {plugin or '?'!r} does not follow the protocol: "
            f"missing member {missing!r}",
            "fix the plugin (see docs/plugins.md)",
        )
    return obj
