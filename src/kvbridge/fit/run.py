"""``kvbridge fit`` as library calls: :func:`fit_run` (a :class:`~kvbridge.run.Run` of a loaded pair and
a :class:`FitSettings` -> mapping(s)), the one path every fit takes (``fit(...)``, the CLI, the demo,
the benches; model objects given in Python are a run too, :func:`kvbridge.run.model_run`).

:func:`prepare` does every check that needs no model (a replaceable ``out`` / ``keep_stats``, the
fitter and its options, the corpus read and split), so a command can fail before loading anything;
:func:`resolve` does, once, what needs the models. The two paths that load no weights take the
references and the settings: :func:`plan_fit` (``--plan``) and :func:`refit` (``--from-stats``).
Nothing is printed here: notes go to ``warn`` (default: :func:`warnings.warn`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Any

from kvbridge.errors import ConfigError
from kvbridge.fit.settings import FitSettings

#: settings fields -> fitter option keys (passed only when given; a fitter without the key refuses it)
SHORTCUTS = {
    "top_k": "top_k",
    "alpha": "alpha",
    "memory_gib": "memory_budget",
    "estimator": "estimator",
    "estimator_options": "estimator_options",
    "max_samples": "max_samples",
}


def option_values(settings: FitSettings) -> dict:
    """The fitter options from ``settings.fitter_options`` and the shortcut fields that were given
    (one ``top_k``; a sweep or ``all`` is the pipeline's ``top_k``)."""
    from kvbridge.fit.protocol import parse_pairs

    values = parse_pairs(settings.fitter_options)
    for name, key in SHORTCUTS.items():
        value = getattr(settings, name)
        if value is None or (name == "top_k" and not isinstance(value, int)):
            continue
        if key in values:
            raise ConfigError(f"option {key} is given twice (a flag and -o {key}=...)", "give it once")
        values[key] = int(value * 2**30) if name == "memory_gib" else value
    return values


@dataclass(frozen=True)
class Prepared:
    """What a fit's settings resolve to: by :func:`prepare`, before any model loads, the fitter option
    values as given, the fitter's options dataclass (checked), the data (texts, token ids or a corpus
    path), the corpus hash and a folder corpus's split, the fitter plugin (loaded once); by
    :func:`resolve`, against the models (the fit's job), the options with top-k clamped, the k sweep
    (``((label, k), ...)``, None for one mapping), the calibration, the corpus path the manifest
    records and the seconds between resumable checkpoints."""

    values: dict
    options: Any
    data: Any
    corpus_sha256: str | None
    split: Any
    fitter: Any = None
    sweep: tuple | None = None
    calibration: Any = None
    corpus_path: Any = None
    checkpoint_every: float = 60.0


#: a :class:`Prepared` resolved against its run (:func:`resolve`)
FitJob = Prepared


def prepare(settings: FitSettings, *, data=None, host=None, options: dict | None = None) -> Prepared:
    """Everything about ``settings`` that can be refused before a model loads; reads the corpus
    (``data``, texts or token ids, replaces ``settings.corpus``). ``options``: fitter option values
    given in Python (:func:`option_base`), under the settings' own."""
    from kvbridge.artifacts import check_replaceable
    from kvbridge.fit.artifact import KIND
    from kvbridge.fit.keep import KIND as STATS_KIND
    from kvbridge.fit.pipeline import SWEEP_KIND, fitter_options
    from kvbridge.plugins import get_host

    for folder, kind in ((settings.out, SWEEP_KIND if settings.sweep else KIND), (settings.keep_stats, STATS_KIND)):
        if folder is not None:
            check_replaceable(folder, kind, overwrite=settings.overwrite)
    values = {**(options or {}), **option_values(settings)}
    fitter = (host or get_host()).get("fitter", settings.fitter)
    checked = fitter_options(fitter, values)
    if data is not None:
        return Prepared(values, checked, data, None, None, fitter)
    if settings.corpus is None:
        raise ConfigError("fit needs calibration data", "give --corpus (FitSettings.corpus), or data= in Python")
    from kvbridge.corpus import calibration_texts

    texts, sha, split = calibration_texts(settings.corpus, settings.corpus_heldout)
    return Prepared(values, checked, texts, sha, split, fitter)


def same_named(cls, settings) -> dict:
    """The values of ``settings``' fields that ``cls`` (a dataclass) has a field of the same name for."""
    return {f.name: getattr(settings, f.name) for f in fields(cls) if hasattr(settings, f.name)}


def source_layers(run) -> int | None:
    layers = getattr(getattr(run.source.model, "config", None), "num_hidden_layers", None)
    return layers if isinstance(layers, int) and layers > 0 else None


def resolve_top_k(run, prepared: Prepared, warn=None):
    """``(options, sweep)``: a list of top-k values (or ``all``) becomes the sweep's ``((label, k), ...)``
    (``all`` alone: one mapping over every source layer) with the options' top-k the largest; a default
    top-k (none given) larger than the source's layers is clamped to them, and ``warn`` told."""
    from kvbridge.fit.pipeline import fitter_options, sweep_labels

    s, options, layers = run.settings, prepared.options, source_layers(run)
    if s.sweep or s.top_k == "all":
        sweep = sweep_labels(list(s.top_k) if s.sweep else "all", layers)
        options = fitter_options(prepared.fitter, options, top_k=max(k for _, k in sweep))
        return options, (tuple(sweep) if s.sweep else None)  # "all" alone: one mapping, not a sweep
    default = getattr(options, "top_k", None)
    given = s.top_k is not None or "top_k" in prepared.values
    if not given and layers is not None and isinstance(default, int) and default > layers:
        name = getattr(run.source.ref, "ref", None) or run.source.name or "the source model"
        note = f"--top-k defaults to {default}, but {name} has {layers} layers: using --top-k {layers} (all of them)"
        (warn or partial(warnings.warn, category=UserWarning, stacklevel=5))(note)
        options = replace(options, top_k=layers)
    return options, None


def validate_job(run, job: FitJob) -> None:
    """The checks of a job that need the models, run once before any work: top-k against the source's
    layers, the sequence length against both position limits, the fitter options (alpha, the
    ``--memory`` budget); the settings' own values were checked by :class:`FitSettings`."""
    from kvbridge.check import validate as v

    config, opts = job.calibration, job.options
    limits = [getattr(m.model.config, "max_position_embeddings", None) for m in (run.source, run.target)]
    max_pos = min([m for m in limits if isinstance(m, int) and m > 0], default=None)
    if getattr(opts, "top_k", None) is not None:
        v.top_k(opts.top_k, source_layers(run))
    if config.seq_len is not None:
        v.seq_len(config.seq_len, max_pos)
    alpha = getattr(opts, "alpha", None)
    if alpha is not None and not isinstance(alpha, (list, tuple)):
        v.alpha(alpha)
    v.memory_gib(getattr(opts, "memory_budget", None))


def resolve(run, *, data=None, prepared: Prepared | None = None, warn=None, checkpoint_every=60.0) -> FitJob:
    """The :class:`FitJob` of ``run`` (a :class:`~kvbridge.run.Run` of a :class:`FitSettings`): the
    settings' refusals (:func:`prepare`, unless given its result), then the checks that need the
    models, once; text calibration is checked to give the same ids with both tokenizers."""
    from kvbridge.fit.calibrate import CalibrationConfig, check_same_tokens

    s = run.settings
    prepared = prepared or prepare(s, data=data, host=run.host)
    options, sweep = resolve_top_k(run, prepared, warn)
    check_budget(s.fitter, options, run.source.spec, run.target.spec, splits=2 if s.heldout > 0 else 1)
    texts, tok_s, tok_t = prepared.data, run.source.tokenizer, run.target.tokenizer
    if isinstance(texts, (list, tuple)) and all(isinstance(t, str) for t in texts) and tok_t not in (None, tok_s):
        check_same_tokens(list(texts), tok_s, tok_t)
    seq_len = None if getattr(texts, "ndim", 0) == 2 else s.seq_len  # [N, L] token ids: L is theirs
    calibration = CalibrationConfig(**{**same_named(CalibrationConfig, s), "seq_len": seq_len}, offset=s.tokens_offset)
    resolved = dict(options=options, sweep=sweep, calibration=calibration, checkpoint_every=checkpoint_every)
    job = replace(prepared, corpus_path=s.corpus if data is None else None, **resolved)
    validate_job(run, job)
    return job


def fit_run(run, *, data=None, prepared=None, progress=None, warn=None, distributed="auto", checkpoint_every=60.0):
    """``kvbridge fit`` on a :class:`~kvbridge.run.Run` (a loaded pair, the host, a :class:`FitSettings`).

    Text is tokenized with the pair's tokenizer (both sides checked to give the same ids). Returns
    the :class:`~kvbridge.fit.mapping.FittedMapping`, or ``{label: mapping}`` for a top-k sweep;
    with ``settings.out`` it is written. ``progress``: the pipeline's ``(kind, tag, n)`` events;
    ``distributed``: a :mod:`kvbridge.fit.distributed` context (``"auto"``: from the environment);
    ``checkpoint_every``: seconds between resumable checkpoints (``--resume``)."""
    from kvbridge.fit.pipeline import execute

    job = resolve(run, data=data, prepared=prepared, warn=warn, checkpoint_every=checkpoint_every)
    return execute(run, job, progress=progress, distributed=distributed)


def fit_pair(pair, settings: FitSettings, *, host=None, **kwargs):
    """Deprecated (0.9): ``fit(pair, settings=settings, ...)``, or :func:`fit_run` on a
    :class:`~kvbridge.run.Run`; kept so scripts written against it still run."""
    from kvbridge.run import Run

    warnings.warn(
        "kvbridge fit_pair(pair, settings) is deprecated: call kvbridge.api.fit(pair, settings=settings)",
        DeprecationWarning,
        stacklevel=2,
    )
    return fit_run(Run.of(pair, settings, host), **kwargs)


def check_budget(fitter: str, options, source_spec, target_spec, splits: int = 2) -> None:
    """Refuse, before any pass over the corpus, a statistics budget (``--memory``) below the smallest
    one the ridge fitters can block the fit into (:func:`kvbridge.fit.plan.minimum_budget`), naming it
    (``options.top_k``: a sweep's largest k; ``splits``: 1 with ``--heldout 0``, else 2, as the corpus
    is not read yet: a one-sequence corpus is held to the two-split minimum here, and blocked as
    one split by the fitter)."""
    budget = getattr(options, "memory_budget", None)
    if fitter not in ("ridge", "ridge-headwise") or budget is None:
        return
    from kvbridge.fit.plan import check_minimum

    s, t = source_spec, target_spec
    k = int(getattr(options, "top_k", s.num_layers) or s.num_layers)
    fs, ft = s.num_kv_heads * s.head_dim, t.num_kv_heads * t.head_dim
    check_minimum(fitter, int(budget), s.num_layers, t.num_layers, fs, s.head_dim, ft, k, splits)


def plan_top_k(settings: FitSettings, source) -> int:
    """The top-k the plan is made for: the largest of a sweep; ``all`` and a default over the source's
    layers become the source's layer count (the plan of a k sweep is the plan of its largest k)."""
    top_k = settings.top_k
    if top_k is None:
        return 4
    values = top_k if isinstance(top_k, tuple) else (top_k,)
    if "all" in values:
        from kvbridge.models import resolve

        return resolve(source).spec().num_layers
    return max(int(v) for v in values)


def plan_fit(source, target, settings: FitSettings):
    """``kvbridge fit --plan``: the resource plan of ``settings`` from the configs alone (no weights;
    torch only with ``settings.plan_device``, to measure rates there)."""
    from kvbridge.check.measured import measured_for, names_of
    from kvbridge.fit.plan import PlanInputs, plan
    from kvbridge.models import resolve

    k = plan_top_k(settings, source)
    s, rates = settings, None
    if s.plan_device:
        from kvbridge.fit.plan_rates import measure_rates

        shape = {name: getattr(s, name) for name in ("seq_len", "batch_size", "stride", "dtype")}
        rates = measure_rates(source, target, **shape, top_k=k, device=s.plan_device)
    inputs = same_named(PlanInputs, s)  # fitter, seq_len, stride, ...
    budget = None if s.memory_gib is None else int(s.memory_gib * 2**30)
    inputs.update(top_k=k, memory_budget=budget, rates=rates)
    opts = dict(o.split("=", 1) for o in s.fitter_options if "=" in o)  # the ridge options the plan depends on
    inputs.update({o: opts[o] for o in ("support", "weighting", "gram_dtype") if o in opts})
    fit_plan = plan(source, target, **inputs)
    measured = measured_for(names_of(resolve(source)), names_of(resolve(target)))
    return replace(fit_plan, measured=tuple(measured)) if measured else fit_plan


def refit(source, target, settings: FitSettings, *, host=None):
    """``kvbridge fit --from-stats``: solve again from the statistics in ``settings.from_stats`` (no
    weights loaded; ``source`` / ``target`` references are checked against the kept specs). Returns
    a mapping, or ``{label: mapping}`` for a top-k sweep; written to ``settings.out``."""
    from kvbridge.artifacts import check_replaceable
    from kvbridge.fit.artifact import KIND, model_identity
    from kvbridge.fit.pipeline import SWEEP_KIND, fit_from_stats
    from kvbridge.models import resolve

    s = settings
    if s.from_stats is None:
        raise ConfigError("refit needs kept statistics", "give --from-stats DIR (FitSettings.from_stats)")
    if s.out is None:
        raise ConfigError("kvbridge fit --from-stats needs --out", "give the mapping folder to write")
    if s.corpus is not None or s.keep_stats is not None:
        raise ConfigError(
            f"--from-stats solves from kept statistics: --{'corpus' if s.corpus is not None else 'keep-stats'}"
            " does not apply",
            "drop it, or fit from the models without --from-stats",
        )
    check_replaceable(s.out, SWEEP_KIND if s.sweep else KIND, overwrite=s.overwrite)
    src, tgt = (model_identity(resolve(ref, host=host).config) for ref in (source, target))  # configs only
    return fit_from_stats(
        s.from_stats, out=s.out, top_k=s.top_k, alpha=s.alpha, source=src, target=tgt, overwrite=s.overwrite, host=host
    )


__all__ = [
    "FitSettings",
    "Prepared",
    "prepare",
    "fit_run",
    "fit_pair",
    "FitJob",
    "resolve",
    "check_budget",
    "plan_fit",
    "plan_top_k",
    "refit",
    "option_values",
]
