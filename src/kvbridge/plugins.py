"""The plugin host: a pluggy manager built by a factory, guarded entry-point loading, and
typed getters so the rest of kvbridge never calls ``pm.hook`` directly.

Every hook call goes through pluggy itself (``pm.hook.<name>(...)``): pluggy's order and its
hook-call monitoring, as :mod:`kvbridge.hookspecs` states them. Each implementation is guarded when
its plugin registers (an exception is recorded on the plugin); hook wrappers are refused there, as
every kvbridge hook collects results from plain implementations.

Isolation: a plugin's import runs in a worker thread and is time-boxed
(:data:`IMPORT_TIMEOUT_S`, ``KVBRIDGE_PLUGIN_IMPORT_TIMEOUT``); ``SystemExit`` raised by a plugin
(at import or in a hook) is caught like any other exception; every hook's result is type-checked
at its one collection point (:meth:`Host.check_findings`, :meth:`Host.adapter_for`,
:meth:`Host.manifest_dirs`, :meth:`Host.register_commands`), and a plugin that returns the wrong
type is disabled (:meth:`Host.disable`). Each plugin that fails or is disabled gets one
``warning: plugin 'NAME' ...`` line on stderr (third-party plugins only) and its record's error.
A plugin command whose name is a built-in command's is refused; the built-in is kept.

Environment variables (llm/tox style):

- ``KVBRIDGE_LOAD_PLUGINS``: comma-separated allow-list of entry-point names to load;
  set but empty loads no third-party plugin. Unset loads all.
- ``KVBRIDGE_DISABLE_PLUGINS``: comma-separated entry-point names to skip.
- ``KVBRIDGE_TRACE_PLUGINS``: any non-empty value traces every hook call to stderr.
- ``KVBRIDGE_PLUGIN_IMPORT_TIMEOUT``: seconds one plugin's import may take (default
  :data:`IMPORT_TIMEOUT_S`); a plugin still importing then is skipped with a warning.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import math
import os
import sys
import threading
import types
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from typing import Any, Callable, Iterable

import pluggy

from kvbridge import hookspecs
from kvbridge.version import __version__
from kvbridge.errors import PluginError, UnsupportedModelError, did_you_mean
from kvbridge.plugin_types import (
    KIND_TABLE,
    SCHEME_RE,
    VERDICTS,
    Finding,
    ModelSource,
    UnknownRopeTypeError,
    check_registration,
    load_registered,
    protocol_problem,
)

ENTRY_POINT_GROUP = "kvbridge"
BUILTIN_PLUGINS = (
    "kvbridge.builtin.families",
    "kvbridge.builtin.family_fallback",
    "kvbridge.builtin.model_sources",
    "kvbridge.builtin.manifests",
    "kvbridge.builtin.rope_variants",
    "kvbridge.builtin.identity",
    "kvbridge.builtin.compat_checks",
    "kvbridge.builtin.fitters",
    "kvbridge.builtin.metrics",
    "kvbridge.builtin.engines",
    "kvbridge.builtin.steering",
    "kvbridge.builtin.tasks",
    "kvbridge.builtin.commands",
)
#: plugin kind -> (what a user calls one, the hook that registers it); :meth:`Host.get` looks them up
KINDS = {kind: row[:2] for kind, row in KIND_TABLE.items()}
#: seconds one plugin's import may take before it is skipped (``KVBRIDGE_PLUGIN_IMPORT_TIMEOUT``)
IMPORT_TIMEOUT_S = 20.0
IMPORT_TIMEOUT_ENV = "KVBRIDGE_PLUGIN_IMPORT_TIMEOUT"
#: model types that have no attention KV cache at all
NO_KV_CACHE_TYPES = frozenset("mamba mamba2 falcon_mamba rwkv rwkv5 rwkv6 rwkv7 xlstm hyena s4 retnet".split())


@dataclass
class PluginRecord:
    """What ``kvbridge plugins`` shows for one plugin."""

    name: str
    version: str
    builtin: bool
    hooks: list[str] = field(default_factory=list)
    registers: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None
    warned: bool = field(default=False, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "warned"}

    def fail(self, problem: str) -> None:
        """Record ``problem`` as this plugin's error unless it has one already (the first one stays)."""
        self.error = self.error or problem


def _env_list(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    return None if raw is None else [x.strip() for x in raw.split(",") if x.strip()]


def _plugin_hook_names(plugin: Any) -> list[str]:
    return sorted(n for n in dir(plugin) if n.startswith("kvbridge_") and callable(getattr(plugin, n)))


class Registry:
    """Name -> object, remembering which plugin registered each name."""

    def __init__(self, kind: str, key: Callable[[Any], Iterable[str]], rank: Callable[[str], int] | None = None):
        self.kind = kind
        self._key = key
        self._rank = rank or (lambda _name: 0)
        self.items: dict[str, Any] = {}
        self.owner: dict[str, str] = {}

    def add(self, obj: Any, plugin: str) -> list[str]:
        names = list(self._key(obj))
        for name in names:
            if name in self.items:
                first, second = sorted((self.owner[name], plugin), key=self._rank)  # registration order
                raise PluginError(
                    f"duplicate {self.kind} {name!r}: registered by both {first!r} and {second!r}",
                    f"rename it in one plugin, or disable one with KVBRIDGE_DISABLE_PLUGINS={second}",
                )
        for name in names:
            self.items[name] = obj
            self.owner[name] = plugin
        return names

    def names(self) -> list[str]:
        return sorted(self.items)


#: the plugin whose implementation is running (registration callables read it)
_CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvbridge_plugin", default=None)
#: while :meth:`Host.call` runs: where guarded implementations report ``HookOutcome`` s
_SINK: contextvars.ContextVar[list | None] = contextvars.ContextVar("kvbridge_sink", default=None)


def current_plugin() -> str | None:
    """The plugin whose hook implementation is running (for ``register`` callables)."""
    return _CURRENT.get()


@dataclass(frozen=True)
class HookOutcome:
    """What one implementation of a hook did in one call: its value, or its one-line error."""

    plugin: str
    value: Any = None
    error: str | None = None


def _exc_text(exc: BaseException) -> str:
    """``Type: message`` on one line (``SystemExit: exit(3)`` for an exit)."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: the plugin called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


def warn(record: PluginRecord, problem: str) -> None:
    """One ``warning: plugin 'NAME' ...`` line on stderr per third-party plugin, control characters escaped."""
    if record.builtin or record.warned:
        return
    record.warned = True
    fix = f"fix the plugin, or skip it with KVBRIDGE_DISABLE_PLUGINS={record.name}"
    with contextlib.suppress(OSError, ValueError):  # no stderr to warn on
        sys.stderr.write(f"warning: {PluginError(f'plugin {record.name!r} disabled: {problem}', fix).one_line()}\n")


def import_timeout() -> float:
    """Seconds one plugin import may take (``KVBRIDGE_PLUGIN_IMPORT_TIMEOUT``, default :data:`IMPORT_TIMEOUT_S`)."""
    raw = os.environ.get(IMPORT_TIMEOUT_ENV, "").strip()
    if not raw:
        return IMPORT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise PluginError(
            f"{IMPORT_TIMEOUT_ENV}={raw!r} is not a positive number of seconds",
            f"set it to e.g. {IMPORT_TIMEOUT_S:g}, or unset it",
        )
    return value


def _import_plugin(ep, timeout: float):
    """``ep.load()`` in a worker thread: ``(plugin, None)`` or ``(None, one-line error)``; an import still
    running after ``timeout`` seconds is left behind (a daemon thread) and reported."""
    box: dict = {}

    def work():
        try:
            box["plugin"] = ep.load()
        except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt raised by the plugin too
            box["error"] = exc

    worker = threading.Thread(target=work, name=f"kvbridge-plugin-import:{ep.name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return None, (
            f"importing {ep.value} did not finish within {timeout:g} s (hung import skipped; "
            f"{IMPORT_TIMEOUT_ENV} sets the limit)"
        )
    if "error" in box:
        if os.environ.get("KVBRIDGE_DEBUG") and not isinstance(box["error"], SystemExit):
            raise box["error"]
        return None, f"failed to import {ep.value}: {_exc_text(box['error'])}"
    return box["plugin"], None


def _guard(hook_name: str, hookimpl, record: PluginRecord):
    """Wrap one implementation: run it as its plugin, record an exception on the plugin."""
    fn = hookimpl.function
    plugin_name = hookimpl.plugin_name

    def guarded(*args):
        sink = _SINK.get()
        token = _CURRENT.set(plugin_name)
        error = None
        try:
            value = fn(*args)
        except PluginError:  # kvbridge's own refusals (duplicate names) name both plugins: let them out
            raise
        except (Exception, SystemExit) as exc:  # a broken plugin must not take the host down (nor exit it)
            if os.environ.get("KVBRIDGE_DEBUG"):
                raise
            value, error = None, f"{hook_name} failed: {_exc_text(exc)}"
            record.fail(error)
        finally:
            _CURRENT.reset(token)
        if sink is not None:
            sink.append(HookOutcome(plugin_name, value, error))
        return value

    guarded.__wrapped__ = fn
    guarded.__name__ = getattr(fn, "__name__", hook_name)
    return guarded


class Host:
    """A plugin manager plus typed, cached registries."""

    def __init__(self, pm: pluggy.PluginManager, records: list[PluginRecord]):
        self.pm = pm
        self.records = records
        self._registries: dict[str, Registry] | None = None
        self._sources: dict | None = None

    def record(self, plugin_name: str) -> PluginRecord | None:
        return next((r for r in self.records if r.name == plugin_name), None)

    def disable(self, plugin_name: str, problem: str) -> None:
        """Take a misbehaving plugin out: unregistered and blocked (its hooks no longer run), its
        registrations dropped, ``problem`` on its record, one warning line on stderr."""
        if self.pm.get_plugin(plugin_name) is not None:
            self.pm.unregister(name=plugin_name)
        self.pm.set_blocked(plugin_name)
        for reg in (self._registries or {}).values():
            for name in [n for n, owner in reg.owner.items() if owner == plugin_name]:
                reg.items.pop(name, None)
                reg.owner.pop(name, None)
        if self._sources:
            self._sources = {n: src for n, src in self._sources.items() if src.plugin != plugin_name}
        record = self.record(plugin_name)
        if record is not None:
            record.fail(problem)
            warn(record, problem)

    def call(self, hook_name: str, **kwargs: Any) -> list[HookOutcome]:
        """Call a hook through pluggy (its order, its monitoring) and return one outcome per
        implementation that ran, in call order; failures are recorded on their plugin."""
        sink: list[HookOutcome] = []
        token = _SINK.set(sink)
        try:
            getattr(self.pm.hook, hook_name)(**kwargs)
        finally:
            _SINK.reset(token)
        return sink

    # -- registries --------------------------------------------------------------------
    def _collect(self) -> dict[str, Registry]:
        if self._registries is not None:
            return self._registries
        order = {r.name: i for i, r in enumerate(self.records)}
        rank = lambda name: order.get(name, len(order))  # noqa: E731
        regs = {kind: Registry(word, lambda o: [o.name], rank) for kind, (word, _hook) in KINDS.items()}
        regs["family"] = Registry("model type", lambda a: a.model_types, rank)
        regs["adapter"] = Registry("family adapter", lambda a: [a.name], rank)
        for kind, (_word, hook_name) in KINDS.items():

            def register(obj: Any, _kind=kind) -> None:
                plugin = _CURRENT.get() or "?"
                record = self.record(plugin)
                obj, problem = check_registration(_kind, obj, plugin)
                if problem:  # does not follow its protocol: refused, the plugin shows the error
                    if record is not None:
                        record.fail(problem)
                    return
                added = regs[_kind].add(obj, plugin)
                if _kind == "family":
                    regs["adapter"].add(obj, plugin)
                if record is not None and added:
                    record.registers.setdefault(_kind, []).extend(added)

            self.call(hook_name, register=register)
        self._registries = regs
        return regs

    def load_all(self) -> None:
        """Run every hook that takes no model once (registrations, manifest folders, model
        sources), so each plugin's failure is on its record, as ``kvbridge plugins`` shows."""
        self._collect()  # duplicate names raise a one-line error naming both plugins
        self.manifest_dirs()
        self.model_sources()

    def registry(self, kind: str) -> Registry:
        return self._collect()[kind]

    def adapters(self) -> list:
        reg = self.registry("adapter")
        return [reg.items[n] for n in reg.names()]

    def adapter_for(self, config: dict) -> Any:
        """The family adapter for a config mapping, or a one-line refusal."""
        model_type = config.get("model_type") if isinstance(config, dict) else None
        if not model_type:
            raise UnsupportedModelError(
                "config has no 'model_type'", "pass a Hugging Face config.json or a model folder that has one"
            )
        families = self.registry("family")
        if model_type in families.items:
            return families.items[model_type]
        if model_type in NO_KV_CACHE_TYPES:
            raise UnsupportedModelError(
                f"model type {model_type!r} has no attention KV cache (recurrent/state-space model)",
                "kvbridge moves attention KV caches; choose a transformer model",
            )
        # plugins first; kvbridge.builtin.family_fallback (trylast) wraps multimodal configs around
        # their text decoder's family and gives transformers' own config classes the generic adapter
        claimed = self._claim_family(config)
        if claimed is not None:
            return claimed
        auto_map = config.get("auto_map")
        if isinstance(auto_map, dict) and auto_map:
            key = sorted(auto_map, key=str)[0]
            raise UnsupportedModelError(
                f"unknown model type {model_type!r}: the config's auto_map ({key} -> {str(auto_map[key])[:60]}) "
                "points at code shipped with the model, which kvbridge never runs",
                "use a model whose architecture transformers implements, or a plugin that supports this type",
            )
        raise UnsupportedModelError(
            f"unknown model type {model_type!r}",
            f"{did_you_mean(model_type, families.names(), cutoff=0.8)}install a plugin that supports it (see `kvbridge plugins` for supported types)",
        )

    def _claim_family(self, config: dict):
        """The first plugin's answer to ``kvbridge_resolve_family`` (firstresult, pluggy's order) that is a
        family adapter; a plugin answering anything else is disabled and the others are asked again."""
        for _ in range(len(self.records) + 1):
            outcomes = self.call(
                "kvbridge_resolve_family", config=config, families=types.MappingProxyType(self.registry("family").items)
            )
            answer = next((o for o in outcomes if o.error is None and o.value is not None), None)
            if answer is None:
                return None
            problem = protocol_problem("family", answer.value)
            if problem is None:
                return answer.value
            self.disable(
                answer.plugin,
                f"kvbridge_resolve_family returned {type(answer.value).__name__} "
                f"{answer.value!r:.60}, not a family adapter (missing {problem!r})",
            )
        return None  # pragma: no cover - every plugin disabled

    def adapter_of(self, model) -> Any:
        """The family adapter of a live model (:meth:`adapter_for` its config), memoised on the model and
        keyed by this host and the config's attributes (a changed config is looked up again)."""
        return memo_on_model(model, "_kvbridge_adapter", lambda: self.adapter_for(model.config.to_dict()), id(self))

    def describe(self, config: dict):
        """ModelSpec of a config mapping through its family adapter, its RoPE variants resolved."""
        return self.resolved(self.adapter_for(config).describe(config))

    def spec_of(self, model):
        """ModelSpec of a live model (its adapter's ``spec_of``), its RoPE variants resolved."""
        return self.resolved(self.adapter_of(model).spec_of(model))

    def resolved(self, spec):
        """``spec`` (a ModelSpec or a RopeSpec) with each RoPE table carrying its variant from this host (an
        unknown type stays unresolved: the codec refuses it when used, naming the known types)."""
        lookup = self.registry("rope_variant").items.get
        if spec is None:
            return None
        return spec.with_rope_variants(lookup) if hasattr(spec, "with_rope_variants") else spec.with_variant(lookup)

    def entry(self, kind: str, name: str) -> Any:
        """The record registered as ``name`` for ``kind``, not loaded (its ``description``, ``factory``);
        :meth:`get`'s one-line error for an unknown name or kind."""
        if kind not in KINDS:
            raise PluginError(f"unknown plugin kind {kind!r}; known: {', '.join(KINDS)}", "ask for one of those kinds")
        reg = self.registry(kind)
        if name in reg.items:
            return reg.items[name]
        word, hook = KINDS[kind]
        hint = did_you_mean(str(name), reg.names())
        raise (UnknownRopeTypeError if kind == "rope_variant" else PluginError)(
            f"unknown {word} {name!r}; known: {', '.join(reg.names()) or 'none'}",
            f"{hint}pick a known one, or install a plugin that registers it ({hook})",
        )

    def get(self, kind: str, name: str) -> Any:
        """The one lookup: what ``name`` is for ``kind`` (one of :data:`KINDS`), loaded and checked against
        its protocol; fitters, steering methods and tasks come back as instances. An unknown name is one
        line: ``unknown KIND 'NAME'; known: ... (fix: ...)``."""
        record = self.entry(kind, name)
        if kind in ("family", "rope_variant"):
            return record
        obj = load_registered(kind, name, record, self.owner(kind, name))
        return obj() if kind in ("fitter", "steering_method", "task") and isinstance(obj, type) else obj

    def names(self, kind: str) -> list[str]:
        """The names registered for ``kind``, sorted."""
        return self.registry(kind).names()

    def owner(self, kind: str, name: str) -> str:
        """The plugin that registered ``name`` as a ``kind`` ("" when unknown)."""
        return self.registry(kind).owner.get(name, "")

    def check_findings(self, source, target) -> list:
        out = []
        for outcome in self.call("kvbridge_check_compatibility", source=source, target=target):
            if outcome.error is not None:
                found = [Finding("plugin", "warning", f"check failed: {outcome.error.split(': ', 1)[1]}")]
            else:
                found = outcome.value if outcome.value is not None else []
                items = found if isinstance(found, (list, tuple)) else [found]
                bad = [f for f in items if not isinstance(f, Finding) or f.verdict not in VERDICTS]
                if bad or items is not found:  # not a list, or an item that is not a Finding
                    shown, what = (bad[0], "an item ") if items is found else (found, "")
                    self.disable(
                        outcome.plugin,
                        f"kvbridge_check_compatibility returned {what}{type(shown).__name__} {shown!r:.60}, not a list "
                        "of Finding records with a known verdict",
                    )
                    continue
            out.extend(replace(f, plugin=outcome.plugin) for f in found)
        return out

    def register_commands(self, cli) -> None:
        """Add the commands plugins register to ``cli``, the built-ins' first (``tryfirst``); a name that is
        a built-in command's (or already on ``cli``) or another plugin's is refused with a warning naming the
        plugin."""
        import click

        offered: list[tuple[str, str, Any]] = []

        class Collector(click.Group):  # what a plugin sees as ``cli``: a real group that remembers who added what
            def add_command(self, cmd, name=None):
                offered.append((current_plugin() or "?", name or cmd.name, cmd))

        self.call("kvbridge_register_commands", cli=Collector(name=getattr(cli, "name", None) or "kvbridge"))
        taken = {n: "kvbridge" for n in getattr(cli, "commands", {})}
        for plugin, name, cmd in offered:
            if not isinstance(cmd, click.Command) or not isinstance(name, str) or not name:
                self.disable(
                    plugin,
                    f"kvbridge_register_commands added {type(cmd).__name__} {cmd!r:.60}, "
                    "not a click command with a name",
                )
                continue
            record = self.record(plugin)
            if name in taken and taken[name] == "kvbridge" and record is not None and record.builtin:
                continue  # a built-in offered again (the group was registered before): nothing to do
            if name in taken:
                who = "the built-in command" if taken[name] == "kvbridge" else f"plugin {taken[name]!r}'s command"
                problem = f"its command {name!r} would replace {who} (refused; the original is kept)"
                if record is not None:
                    record.fail(problem)
                    warn(record, problem)
                continue
            taken[name] = "kvbridge" if record is not None and record.builtin else plugin
            cli.add_command(cmd, name)

    def model_sources(self) -> dict:
        """Reference schemes (``NAME:REST``) by name, from ``kvbridge_register_model_sources``: the built-ins'
        first (``zoo:``), then plugins in the host's order; a name taken by an earlier plugin, or a
        registration that is not a lowercase name and a callable, is refused on that plugin's record."""
        if self._sources is not None:
            return self._sources
        offered: list[tuple[str, Any, Any, Any]] = []

        def register(name: str, resolver: Callable[[str], Any], description: str = "") -> None:
            offered.append((current_plugin() or "?", name, resolver, description))

        self.call("kvbridge_register_model_sources", register=register)
        order = {r.name: i for i, r in enumerate(self.records)}
        out: dict[str, ModelSource] = {}
        for plugin, name, resolver, description in sorted(offered, key=lambda o: order.get(o[0], len(order))):
            if not isinstance(name, str) or not SCHEME_RE.match(name):
                problem = f"registered model source {name!r:.40}, not a lowercase scheme name such as 'myhub'"
            elif not callable(resolver):
                problem = f"model source {name!r} has no callable resolver (call register(name, resolver, description))"
            elif name in out:
                problem = f"registered model source {name!r}, which {out[name].plugin!r} already provides"
            else:
                out[name] = ModelSource(name, resolver, str(description or ""), plugin)
                continue
            self.disable(plugin, problem)
        self._sources = out
        return out

    def manifest_dirs(self) -> list:
        """Folders published through ``kvbridge_manifest_dirs``: a path, a list of paths or None per
        plugin; a failing plugin is recorded, one returning anything else is disabled."""
        from pathlib import Path

        out: list = []
        for outcome in self.call("kvbridge_manifest_dirs"):
            if outcome.error is not None or outcome.value is None:
                continue
            items = outcome.value if isinstance(outcome.value, (list, tuple)) else [outcome.value]
            bad = [p for p in items if p is not None and not isinstance(p, (str, os.PathLike))]
            if bad:  # an item of the list, or the one value (not None) when it is not a list
                self.disable(
                    outcome.plugin,
                    f"kvbridge_manifest_dirs returned {type(bad[0]).__name__} {bad[0]!r:.60}, "
                    "not a folder path or a list of them",
                )
                continue
            out.extend(Path(p) for p in items if p)
        return out


def _validate(plugin: Any) -> str | None:
    """A one-line error for a plugin whose hook names are not kvbridge hooks, else None."""
    known = {n for n in dir(hookspecs) if n.startswith("kvbridge_")}
    bad = [n for n in _plugin_hook_names(plugin) if n not in known]
    if bad:
        hint = did_you_mean(bad[0], sorted(known), n=1).rstrip()
        return f"unknown hook {bad[0]!r}" + (f" ({hint})" if hint else "")
    return None


def make_host(*, builtins: bool = True, entry_points: bool = True, extra: Iterable[tuple[str, Any]] = ()) -> Host:
    """Build an isolated plugin host (no registration happens at import time).

    ``extra`` registers ``(name, plugin_object)`` pairs, as tests and embedding code do.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    records: list[PluginRecord] = []
    disabled = set(_env_list("KVBRIDGE_DISABLE_PLUGINS") or [])

    def add(name: str, plugin: Any, version: str, builtin: bool) -> None:
        record = PluginRecord(name=name, version=version, builtin=builtin, hooks=_plugin_hook_names(plugin))
        records.append(record)
        record.error = _validate(plugin)
        if record.error:
            return
        try:
            pm.register(plugin, name=name)
        except Exception as exc:
            record.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            return
        impls = [(c, h) for c in pm.get_hookcallers(plugin) or [] for h in c.get_hookimpls() if h.plugin is plugin]
        for caller, hookimpl in impls:
            if hookimpl.wrapper or hookimpl.hookwrapper:
                flag = "wrapper=True" if hookimpl.wrapper else "hookwrapper=True"
                pm.unregister(plugin)
                record.error = (
                    f"plugin {name!r}: {caller.name} is a hook wrapper ({flag}), which kvbridge "
                    "does not take (fix: drop the flag and return the value from a plain hookimpl)"
                )
                return
        for caller, hookimpl in impls:
            hookimpl.function = _guard(caller.name, hookimpl, record)

    if builtins:
        for modname in (m for m in BUILTIN_PLUGINS if m not in disabled):
            add(modname, importlib.import_module(modname), __version__, True)

    if entry_points:
        allow = _env_list("KVBRIDGE_LOAD_PLUGINS")
        timeout = import_timeout()
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if ep.name in disabled or (allow is not None and ep.name not in allow):
                continue
            version = getattr(ep.dist, "version", "?") if ep.dist else "?"
            plugin, error = _import_plugin(ep, timeout)
            if error is not None:
                record = PluginRecord(name=ep.name, version=version, builtin=False, error=error)
                records.append(record)
                warn(record, error)
                continue
            add(ep.name, plugin, version, False)

    for name, plugin in extra:
        add(name, plugin, getattr(plugin, "__version__", "local"), False)

    if os.environ.get("KVBRIDGE_TRACE_PLUGINS"):  # pluggy's hook-call monitoring: every hook call
        pm.trace.root.setwriter(lambda msg: sys.stderr.write(f"[kvbridge-plugins] {msg}"))
        pm.enable_tracing()
    return Host(pm, records)


_DEFAULT: Host | None = None


def get_host() -> Host:
    """The process-wide host, built on first use."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = make_host()
    return _DEFAULT


def host_or_default(host: Host | None = None) -> Host:
    """``host``, or the process-wide one when None (where a stage takes ``host=None``)."""
    return get_host() if host is None else host


def memo_on_model(model, attr: str, compute: Callable[[], Any], *key: Any) -> Any:
    """``compute()`` kept on ``model`` (in ``model.__dict__[attr]``) and computed again once the config's
    attributes, or ``key``, differ from those it was computed for."""
    key = (type(model.config).__name__, repr(vars(model.config)), *key)
    memo = model.__dict__.get(attr)
    if memo is None or memo[0] != key:
        memo = model.__dict__[attr] = (key, compute())
    return memo[1]


def adapter_of(model, host: Host | None = None):
    """The family adapter of a loaded ``model``, through ``host`` (default the process's)."""
    return host_or_default(host).adapter_of(model)
