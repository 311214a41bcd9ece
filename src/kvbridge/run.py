"""A resolved run: the one value a stage reads below the command line.

A :class:`Run` holds what is loaded (a :class:`~kvbridge.models.pair.ModelPair`: both models with
their reference, spec, fingerprint and tokenizer, computed once), the plugin host, and what was asked
(the stage's frozen settings: :class:`~kvbridge.fit.settings.FitSettings`,
:class:`~kvbridge.evaluate.settings.EvalSettings`, ...). A stage takes a run and reads it; it never
takes the pair apart into raw modules plus keyword arguments. What a stage derives from the models
once (a model's identity for a manifest or a mapping check) is kept on the run with :meth:`Run.once`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from kvbridge.plugins import host_or_default


@dataclass(frozen=True)
class Run:
    """``pair``: the loaded :class:`~kvbridge.models.pair.ModelPair`; ``settings``: the stage's
    settings object; ``host``: the plugin host every lookup goes through."""

    pair: Any = field(repr=False)
    settings: Any
    host: Any = field(repr=False)
    _memo: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    @classmethod
    def of(cls, pair, settings, host=None) -> "Run":
        """A run of ``settings`` on a loaded ``pair`` (``host`` default: the process's host)."""
        return cls(pair, settings, host_or_default(host))

    @property
    def source(self):
        """The source :class:`~kvbridge.models.loading.LoadedModel`."""
        return self.pair.source

    @property
    def target(self):
        """The target :class:`~kvbridge.models.loading.LoadedModel`."""
        return self.pair.target

    @property
    def model(self):
        """The one loaded model of a single-model stage (``steer build``, ``steer run``, ``steer eval``):
        its run's ``pair`` is that :class:`~kvbridge.models.loading.LoadedModel`."""
        return self.pair

    @property
    def tokenizer(self) -> dict:
        """The tokenizer fingerprint both models share (checked once, when the pair loaded)."""
        return self.pair.tokenizer

    def with_settings(self, settings) -> "Run":
        """The same loaded pair and host with other settings (what was derived from the models is kept)."""
        return replace(self, settings=settings)

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` the first time ``key`` is asked of this run (or of one made from it by
        :meth:`with_settings`), the kept value after."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]


@dataclass(frozen=True)
class InMemoryModel:
    """A model object given in Python (not loaded from a reference), read like a
    :class:`~kvbridge.models.loading.LoadedModel`: ``model``, ``tokenizer`` (or None), ``spec``, and
    the ``name`` / ``revision`` its manifest records (``ref`` is None: no files behind it)."""

    model: Any = field(repr=False)
    tokenizer: Any = field(repr=False)
    spec: Any = field(repr=False)
    name: str = ""
    revision: str | None = None
    ref: Any = None

    @classmethod
    def of(cls, model, host, tokenizer=None, name: str = "", revision: str | None = None) -> "InMemoryModel":
        return cls(model, tokenizer, host.adapter_of(model).spec_of(model), name, revision)


def model_run(source, target, settings, host=None, *, tokenizer=None, names=("", ""), revisions=(None, None)) -> Run:
    """A run of ``settings`` on two model objects given in Python (each an :class:`InMemoryModel`, both
    with ``tokenizer``; ``names`` / ``revisions``: what manifests record, default their configs' ``_name_or_path`` and no revision):
    what ``fit(model, model, ...)``, the demo, the benches and the tests that build models pass a stage."""
    from kvbridge.models.pair import ModelPair

    host = host_or_default(host)
    sides = [InMemoryModel.of(m, host, tokenizer, n, r) for m, n, r in zip((source, target), names, revisions)]
    return Run(ModelPair(*sides, {}), settings, host)
