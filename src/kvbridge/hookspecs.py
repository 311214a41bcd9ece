"""The kvbridge hooks. Their docstrings are the plugin reference (see README "Writing a plugin").

A plugin is any module or object with functions named like these hooks, decorated with
``kvbridge.hookimpl``, published under the entry-point group ``kvbridge``::

    [project.entry-points.kvbridge]
    myplugin = "my_package.plugin"

Registration hooks receive a ``register`` callable: call it once per object you provide.
Names must be unique across all plugins; a duplicate is an error naming both plugins.
Objects crossing hooks are frozen dataclasses, so fields can be added without changing a
hook's signature. Hook specs only ever gain arguments.
"""

from __future__ import annotations

import pluggy

PROJECT = "kvbridge"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def kvbridge_register_families(register):
    """Register model-family adapters (cache extraction / injection).

    Call ``register(adapter)`` with a :class:`kvbridge.adapter.FamilyAdapter` for each family.
    An adapter lists the ``model_types`` it handles, turns a config mapping into a
    :class:`kvbridge.check.spec.ModelSpec` (``describe``), extracts a model's cache into a
    :class:`kvbridge.kvstate.KVState` (``extract``) and injects a state back into a cache that
    ``generate`` continues from (``inject``). Subclass ``FamilyAdapter`` and override only what
    differs from the Hugging Face defaults. A model type claimed by two adapters is an error.
    """


@hookspec(firstresult=True)
def kvbridge_resolve_family(config):
    """Claim a model type that no registered adapter lists.

    Called with the config mapping (``config["model_type"]`` is the type) only when no adapter
    lists it. Return a ``FamilyAdapter`` to handle it, or ``None`` to pass. The first non-None
    answer wins. Without a claim, kvbridge refuses the model with a clear error.
    """


@hookspec
def kvbridge_register_rope_variants(register):
    """Register RoPE variants (frequency tables for a ``rope_type``).

    Call ``register(variant)`` with a :class:`kvbridge.rope.RopeVariant`: its ``name`` is the
    ``rope_type`` it handles and its ``inv_freq(rope, seq_len)`` returns the inverse frequencies
    and the attention scaling for a :class:`kvbridge.check.spec.RopeSpec` at a forward length.
    kvbridge's codec uses it to remove RoPE from cached keys and to re-apply it at any position.
    """


@hookspec
def kvbridge_check_compatibility(source, target):
    """Add findings to the compatibility report of a (source, target) pair.

    ``source`` and ``target`` are :class:`kvbridge.check.spec.ModelSpec`. Return a list of
    :class:`kvbridge.plugin_types.Finding` (or ``None``). Every plugin's findings are shown;
    a ``blocking`` finding makes the pair incompatible.
    """


@hookspec
def kvbridge_register_fitters(register):
    """Register mapping fitters (how a source cache is turned into a target cache).

    Call ``register(fitter)`` with a :class:`kvbridge.plugin_types.Fitter`: a ``name`` (the
    ``--fitter`` value), a one-line ``description`` and a ``factory`` path ``"module:attr"``
    loaded lazily when the fitter is used, so registration stays cheap.
    """


@hookspec
def kvbridge_register_metrics(register):
    """Register quality metrics (how a transferred cache is judged against the native one).

    Call ``register(metric)`` with a :class:`kvbridge.plugin_types.Metric`: a ``name``, a
    one-line ``description``, whether higher is better, and a lazy ``factory`` path.
    """


@hookspec
def kvbridge_register_commands(cli):
    """Add commands to the ``kvbridge`` CLI.

    ``cli`` is the root :class:`click.Group`; call ``cli.add_command(cmd)``. Keep heavy imports
    inside the command body so ``kvbridge --help`` stays fast.
    """


@hookspec
def kvbridge_manifest_dirs():
    """Publish folders of model manifest records (format: ``manifests/README.md``).

    Return a path or a list of paths. Their ``*.json`` / ``*.toml`` records are read after
    ``$KVBRIDGE_MANIFEST_PATH`` and the built-in ``manifests/models``, so a plugin's record
    never overrides a built-in one. ``kvbridge check NAME ...`` then finds the model by name
    with no weights or config on disk.
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
