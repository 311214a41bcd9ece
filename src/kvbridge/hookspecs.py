"""The kvbridge hooks: each docstring states its contract, with types and one example.

These docstrings are the plugin reference; ``docs/plugins.md`` is generated from them
(``python -m tools.plugin_docs > docs/plugins.md``) together with the how-to for each
plugin kind. A plugin is any module or object with functions named like these hooks,
decorated with ``kvbridge.hookimpl``, published under the entry-point group ``kvbridge``::

    [project.entry-points.kvbridge]
    myplugin = "my_package.plugin"

How the host calls them (pluggy's semantics, kept): implementations run in pluggy's order
(``@hookimpl(tryfirst=True)`` first, then the others, the last registered first, then
``trylast``); ``KVBRIDGE_TRACE_PLUGINS=1`` traces every call; an exception inside an
implementation is recorded on its plugin (``kvbridge plugins`` shows it) and the call goes
on with the other plugins. Hook wrappers (``wrapper=True`` / ``hookwrapper=True``) are refused
when the plugin registers, with a one-line error naming it.

Registration hooks receive a ``register`` callable: call it once per object you provide. The
host checks each object against its protocol (:mod:`kvbridge.plugin_types`) and refuses one
that misses a member, naming the plugin and the member. Names must be unique across all
plugins; a duplicate is an error naming both plugins. Objects crossing hooks are frozen
dataclasses, so fields can be added without changing a hook's signature. Hook specs only
ever gain arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    import os

    import click

    from kvbridge.spec import ModelSpec
    from kvbridge.plugin_types import Engine, Finding, Fitter, Metric, RopeVariant, Scorer, SteeringMethod, Task
    from kvbridge.plugin_types import FamilyAdapterProtocol as FamilyAdapter  # the class: kvbridge.family_adapter

PROJECT = "kvbridge"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def kvbridge_register_families(register: Callable[[FamilyAdapter], None]) -> None:
    """Register model-family adapters (cache extraction and injection per model type).

    :param register: call ``register(adapter)`` once per :class:`kvbridge.family_adapter.FamilyAdapter`.

    An adapter lists the ``model_types`` it handles, turns a config mapping into a
    :class:`kvbridge.spec.ModelSpec` (``describe(config) -> ModelSpec``), extracts a
    model's cache into a :class:`kvbridge.kvstate.KVState` (``extract``) and injects a state back
    into a cache that ``generate`` continues from (``inject``). Subclass ``FamilyAdapter`` and
    override only what differs from the Hugging Face defaults. Protocol members checked at
    registration: ``name``, ``model_types``, ``describe``. A model type claimed by two adapters
    is an error naming both plugins. Prove it with :class:`kvbridge.testing.AdapterContract`.

    Example::

        @dataclass(frozen=True)
        class MyAdapter(FamilyAdapter):
            name: str = "myfamily"
            model_types: tuple = ("myfamily",)

            def describe(self, config):
                return ModelSpec(model_type="myfamily", num_layers=config["n_layer"], ...)

        @hookimpl
        def kvbridge_register_families(register):
            register(MyAdapter())
    """


@hookspec(firstresult=True)
def kvbridge_resolve_family(config: dict, families: Mapping[str, FamilyAdapter]) -> FamilyAdapter | None:
    """Claim a model type that no registered adapter lists.

    :param config: the model's config mapping (``config["model_type"]`` is the type).
    :param families: the registered adapters by model type, read-only (an implementation may take
        only ``config``).
    :returns: a :class:`kvbridge.family_adapter.FamilyAdapter` to handle it, or ``None`` to pass.

    Called only when no adapter lists the type; the first non-``None`` answer wins (pluggy's
    ``firstresult``: ``tryfirst`` implementations are asked first). Without a claim, kvbridge
    refuses the model with a one-line error. kvbridge's own fallback (multimodal wrappers around a
    known text decoder, then transformers' config classes through the generic adapter) is an
    implementation of this hook marked ``trylast``.

    Example::

        @hookimpl
        def kvbridge_resolve_family(config):
            if config["model_type"].startswith("mycorp-"):
                return MyAdapter(model_types=(config["model_type"],))
            return None
    """


@hookspec
def kvbridge_register_rope_variants(register: Callable[[RopeVariant], None]) -> None:
    """Register RoPE variants (frequency tables for a ``rope_type``).

    :param register: call ``register(variant)`` once per :class:`kvbridge.plugin_types.RopeVariant`.

    A variant's ``name`` is the ``rope_type`` it handles; its
    ``inv_freq(rope: RopeSpec, seq_len: int | None) -> (inv_freq, attention_scaling)`` returns
    ``rope.rotary_dim // 2`` inverse frequencies (a float32 tensor, or anything
    ``torch.as_tensor`` takes) and the factor the cos/sin tables are multiplied by, for a
    :class:`kvbridge.spec.RopeSpec` at a forward length (``None``: the static table). A
    third ``device`` argument is optional. kvbridge's codec uses it to remove RoPE from cached
    keys and to re-apply it at any position. Protocol members checked at registration: ``name``,
    ``inv_freq``. Prove it with :class:`kvbridge.testing.RopeVariantContract`.

    Example::

        def theta_scaled(rope, seq_len):
            dim = rope.rotary_dim
            exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
            return 1.0 / (rope.theta * rope.param("factor", 1.0)) ** exponents, 1.0

        @hookimpl
        def kvbridge_register_rope_variants(register):
            register(RopeVariant(name="theta-scaled", inv_freq=theta_scaled, description="theta x factor"))
    """


@hookspec
def kvbridge_check_compatibility(source: ModelSpec, target: ModelSpec) -> list[Finding] | None:
    """Add findings to the compatibility report of a (source, target) pair.

    :param source: the source model's :class:`kvbridge.spec.ModelSpec`.
    :param target: the target model's :class:`kvbridge.spec.ModelSpec`.
    :returns: a list of :class:`kvbridge.plugin_types.Finding` (or ``None``).

    Every plugin's findings are shown, each tagged with its plugin; a ``blocking`` finding makes
    the pair incompatible. An exception becomes a ``warning`` finding naming the plugin.

    Example::

        @hookimpl
        def kvbridge_check_compatibility(source, target):
            if source.vocab_size != target.vocab_size:
                return [Finding("vocab", "blocking", "different vocabularies: ids do not line up",
                                source.vocab_size, target.vocab_size)]
            return []
    """


@hookspec
def kvbridge_register_fitters(register: Callable[[Fitter], None]) -> None:
    """Register mapping fitters (how a source cache is turned into a target cache).

    :param register: call ``register(fitter)`` with a :class:`kvbridge.plugin_types.Fitter`
        record (``name``: the ``--fitter`` value; ``description``: one line; ``factory``: the
        fitter class, or its ``"module:Class"`` path loaded when the fitter is used, so
        registration stays cheap), or with the fitter class itself.

    The class follows :class:`kvbridge.fit.protocol.FitterProtocol`: ``name``, ``Options`` (a
    frozen dataclass of its options; ``kvbridge fit -o key=value`` fills it, coercing types and
    refusing unknown keys) and ``fit(source_spec, target_spec, calibration, options) -> mapping``
    whose ``report`` is a :class:`kvbridge.fit.protocol.FitReport`. A class missing a member is
    refused naming the plugin and the member. Prove it with
    :class:`kvbridge.testing.FitterContract`.

    Example::

        @dataclass(frozen=True)
        class LassoOptions:
            alpha: float = 0.1

        class LassoFitter:
            name = "lasso"
            Options = LassoOptions

            def fit(self, source_spec, target_spec, calibration, options):
                ...  # -> FittedMapping(source_spec, target_spec, layers, report=FitReport(...))

        @hookimpl
        def kvbridge_register_fitters(register):
            register(Fitter("lasso", "sparse linear maps", "my_package.lasso:LassoFitter"))
    """


@hookspec
def kvbridge_register_metrics(register: Callable[[Metric], None]) -> None:
    """Register quality metrics (how a transferred cache is judged against the native one).

    :param register: call ``register(metric)`` with a :class:`kvbridge.plugin_types.Metric`:
        ``name``, one-line ``description``, ``factory`` (the function, or its ``"module:attr"``
        path loaded when ``kvbridge eval`` computes metrics) and ``higher_is_better``.

    The function is ``metric(view: EvalView) -> R values`` (a tensor, or one number called per
    replicate): ``view`` holds one condition's per-sample arrays with a leading replicate
    dimension (:class:`kvbridge.evaluate.metrics.EvalView` lists the fields). Return ``nan``
    where the metric does not apply; an exception inside it stops ``kvbridge eval`` with a
    one-line error naming the metric and its plugin. Prove it with
    :class:`kvbridge.testing.MetricContract`.

    Example::

        def worst_kl(view):
            return view["kl"].double().flatten(1).max(1).values

        @hookimpl
        def kvbridge_register_metrics(register):
            register(Metric("kl_max", "largest KL(native || x) over positions", worst_kl, higher_is_better=False))
    """


@hookspec
def kvbridge_register_engines(register: Callable[[Engine], None]) -> None:
    """Register inference engines (caches handed to and read back from a serving engine).

    :param register: call ``register(engine)`` with a :class:`kvbridge.plugin_types.Engine`:
        ``name`` (the ``--engine`` value), one-line ``description``, ``factory`` (the engine
        object, or its ``"module:attr"`` path loaded when the engine is used) and ``suffix``.

    The object follows :class:`kvbridge.plugin_types.EngineProtocol`:
    ``export_state(state, model, out=None, **options) -> bytes`` turns a
    :class:`kvbridge.kvstate.KVState` into the engine's own saved-cache format (dtype, rotary
    layout, token ids and positions as the engine keeps them) and
    ``import_state(src, model, **options) -> KVState`` reads one back; ``model`` is the model the
    engine runs. Both refuse a state whose geometry is not the model's with a one-line
    :class:`kvbridge.errors.KVBridgeError`. ``kvbridge pack export --engine NAME`` and
    ``kvbridge engine import`` use it. The built-in ``llamacpp`` engine registers through this
    hook too (:mod:`kvbridge.builtin.engines`).

    Example::

        @hookimpl
        def kvbridge_register_engines(register):
            register(Engine("myengine", "my server's prefix-cache files", "my_package.engine:ENGINE", ".kv"))
    """


@hookspec
def kvbridge_register_steering_methods(register: Callable[[SteeringMethod], None]) -> None:
    """Register steering methods (how ``kvbridge steer run|eval`` changes a model's behaviour).

    :param register: call ``register(method)`` with a :class:`kvbridge.plugin_types.SteeringMethod`
        record (``name``: the ``--method`` value; ``description``: one line; ``factory``: the class,
        or its ``"module:Class"`` path loaded when the method is used).

    The class has ``name``, ``Options`` (a frozen dataclass; ``-o key=value`` fills it) and
    ``plan(context: SteerContext, options) -> SteerPlan``
    (:mod:`kvbridge.steer.methods`): ``context`` holds the model, its spec, the unsteered prefix
    state (never modify it), the edited positions ``start:stop``, the chosen ``layers``, and the
    steering ``vector`` / ``other`` prompt's state when given; the plan is the prefix state to
    continue from (marked ``approximate=True`` when edited) and optional ``hooks(model)``, a context
    manager active during the live prefill and every decode step. A ``neutral`` class attribute
    names the options under which the method changes nothing (the run is then bitwise the
    unsteered one). Prove it with :class:`kvbridge.testing.SteeringMethodContract`.

    Example::

        @dataclass(frozen=True)
        class DampOptions:
            factor: float = 0.5

        class Damp:
            name = "v-damp"
            Options = DampOptions
            neutral = {"factor": 1.0}

            def plan(self, ctx, options):
                from kvbridge.steer.edit import scale_kv
                return SteerPlan(scale_kv(ctx.state, cv=options.factor, layers=ctx.layers,
                                          start=ctx.start, stop=ctx.stop))

        @hookimpl
        def kvbridge_register_steering_methods(register):
            register(SteeringMethod("v-damp", "scale cached values down", Damp))
    """


@hookspec
def kvbridge_register_scorers(register: Callable[[Scorer], None]) -> None:
    """Register behaviour scorers (does a sampled continuation show a behaviour?).

    :param register: call ``register(scorer)`` with a :class:`kvbridge.plugin_types.Scorer`:
        ``name`` (the ``--scorer`` value), one-line ``description`` and ``factory`` (a function
        ``text -> bool``, or its ``"module:attr"`` path loaded when ``kvbridge steer eval`` scores).

    A scorer must be deterministic (regular expressions, lexicons, parsers: no model judges) and
    must not raise on any text (empty, unicode, very long). ``kvbridge steer eval`` reports the
    rate of ``True`` per arm with Wilson intervals. Prove it with
    :class:`kvbridge.testing.ScorerContract` (examples that must score ``True`` and ``False``).

    Example::

        def shouts(text):
            letters = [c for c in text if c.isalpha()]
            return len(letters) >= 10 and sum(c.isupper() for c in letters) > 0.8 * len(letters)

        @hookimpl
        def kvbridge_register_scorers(register):
            register(Scorer("shouting", "mostly upper-case letters", shouts))
    """


@hookspec
def kvbridge_register_tasks(register: Callable[[Task], None]) -> None:
    """Register harness tasks (what ``kvbridge harness --tasks`` runs to measure task accuracy).

    :param register: call ``register(task)`` with a :class:`kvbridge.plugin_types.Task` record
        (``name``: the ``--tasks`` value; ``description``: one line; ``factory``: the task class,
        or its ``"module:Class"`` path loaded when the task runs).

    The class follows :class:`kvbridge.harness.protocol.TaskProtocol`: ``name``, ``Options`` (a
    frozen dataclass; ``kvbridge harness -o NAME.key=value`` fills it), ``items(options,
    tokenizer)`` returning :class:`kvbridge.harness.protocol.GenItem` (greedy generation, scored by
    ``score(item, completion) -> 0..1``) or :class:`kvbridge.harness.protocol.ChoiceItem`
    (log-likelihood of each choice) records, and ``chance(item)`` (the floor of the
    floor-normalised retention). Optional flags: ``no_context`` (the no-context condition is
    meaningful) and ``executes_code`` (scoring runs generated code: refused without
    ``--allow-code-execution``). Every condition sees the same items and token ids.

    Example::

        @dataclass(frozen=True)
        class CapitalsOptions:
            n: int = 10

        class CapitalsTask:
            name = "capitals"
            Options = CapitalsOptions
            no_context = True

            def items(self, options, tokenizer):
                return [GenItem(id="fr", context="France's capital is Paris.\n",
                                query="The capital of France is", answer="Paris")]

            def score(self, item, completion):
                return float(completion.strip().startswith(item.answer))

            def chance(self, item):
                return 0.0

        @hookimpl
        def kvbridge_register_tasks(register):
            register(Task("capitals", "capital cities from the context", "my_package.capitals:CapitalsTask"))
    """


@hookspec
def kvbridge_register_commands(cli: click.Group) -> None:
    """Add commands to the ``kvbridge`` CLI.

    :param cli: the root :class:`click.Group`; call ``cli.add_command(cmd)``.

    Keep heavy imports (torch, transformers) inside the command body so ``kvbridge --help``
    stays fast. Raise a :class:`kvbridge.errors.KVBridgeError` for bad input: the CLI prints it
    as one line and exits 2.

    Example::

        @click.command("hello")
        def hello():
            click.echo("hi from a plugin")

        @hookimpl
        def kvbridge_register_commands(cli):
            cli.add_command(hello)
    """


@hookspec
def kvbridge_manifest_dirs() -> str | os.PathLike | list[str | os.PathLike] | None:
    """Publish folders of model manifest records (format: ``manifests/README.md``).

    :returns: a path, a list of paths, or ``None``.

    Their ``*.json`` / ``*.toml`` records are read after ``$KVBRIDGE_MANIFEST_PATH`` and the
    built-in ``manifests/models``, so a plugin's record never overrides a built-in one.
    ``kvbridge check NAME ...`` then finds the model by name with no weights or config on disk.

    Example::

        @hookimpl
        def kvbridge_manifest_dirs():
            return [Path(__file__).parent / "manifests"]
    """


@hookspec
def kvbridge_register_model_sources(register):
    """Register model-reference schemes: ``SCHEME:REST`` names that resolve to a model.

    Call ``register(scheme: str, resolver: Callable[[str], str | os.PathLike | ModelRef],
    description: str = "")``. ``scheme`` is a lowercase name (``[a-z][a-z0-9_.+-]*``); every
    reference ``scheme:REST`` (on the command line or in :func:`kvbridge.models.resolve`) calls
    ``resolver(REST)``, which returns a local path (a model folder, a ``.gguf`` file or a folder
    holding one, a ``config.json``; resolved like a path the user typed) or a ready
    :class:`kvbridge.models.ModelRef`. A resolver must not download anything and should be cheap
    (``describe`` and ``check`` call it); raise :class:`kvbridge.errors.ConfigError` for a bad
    ``REST``. A scheme already registered (``zoo`` is built in) is refused with a PluginError.

    Example::

        @hookimpl
        def kvbridge_register_model_sources(register):
            register("team", lambda name: f"/models/team/{name}", "our shared model folder")

    after which ``kvbridge describe team:llama-ft`` reads ``/models/team/llama-ft``.
    """
