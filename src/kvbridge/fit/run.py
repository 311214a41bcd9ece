"""``kvbridge fit`` as library calls: :func:`fit_pair` (a loaded pair + settings -> mapping(s)).

:func:`prepare` does every check that needs no model (a replaceable ``out`` / ``keep_stats``, the
fitter and its options, the corpus read and split), so a command can fail before loading anything;
:func:`fit_pair` calls it when not given its result. The two paths that load no weights take the
references and the settings: :func:`plan_fit` (``--plan``) and :func:`refit` (``--from-stats``).
Nothing is printed here: notes go to ``warn`` (default: :func:`warnings.warn`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

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
    values: dict  # the fitter option values as given
    options: Any  # the fitter's options dataclass, checked
    data: Any  # calibration texts (or token ids)
    corpus_sha256: str | None
    split: Any  # a folder corpus's Split, else None


def prepare(settings: FitSettings, *, data=None, host=None) -> Prepared:
    """Everything about ``settings`` that can be refused before a model loads; reads the corpus
    (``data``, texts or token ids, replaces ``settings.corpus``)."""
    from kvbridge.artifacts import check_replaceable
    from kvbridge.fit.artifact import KIND
    from kvbridge.fit.pipeline import SWEEP_KIND, fitter_options
    from kvbridge.plugins import get_host

    if settings.out is not None:
        check_replaceable(settings.out, SWEEP_KIND if settings.sweep else KIND, overwrite=settings.overwrite)
    if settings.keep_stats is not None:
        from kvbridge.fit.keep import KIND as STATS_KIND

        check_replaceable(settings.keep_stats, STATS_KIND, overwrite=settings.overwrite)
    values = option_values(settings)
    options = fitter_options((host or get_host()).get("fitter", settings.fitter), values)
    if data is not None:
        return Prepared(values, options, data, None, None)
    if settings.corpus is None:
        raise ConfigError("fit needs calibration data", "give --corpus (FitSettings.corpus), or data= in Python")
    from kvbridge.fit.calibrate import calibration_texts

    texts, sha, split = calibration_texts(settings.corpus, settings.corpus_heldout)
    return Prepared(values, options, texts, sha, split)


def _revision(ref) -> str | None:
    """The commit of a Hugging Face cache snapshot (its folder name), else None."""
    from pathlib import Path

    return Path(ref.folder).name if getattr(ref, "kind", None) == "hf-cache" and ref.folder else None


def fit_pair(
    pair,
    settings: FitSettings,
    *,
    data=None,
    prepared: Prepared | None = None,
    progress: Callable | None = None,
    warn: Callable[[str], None] | None = None,
    distributed: Any = "auto",
    host=None,
):
    """Fit ``pair.source``'s cache to ``pair.target``'s (see ``kvbridge fit``) on a loaded
    :class:`~kvbridge.models.pair.ModelPair`.

    Text is tokenized with the pair's tokenizer (both sides checked to give the same ids). Returns
    the :class:`~kvbridge.fit.mapping.FittedMapping`, or ``{label: mapping}`` for a top-k sweep;
    with ``settings.out`` it is written. ``progress``: the pipeline's ``(kind, tag, n)`` events;
    ``distributed``: a :mod:`kvbridge.fit.distributed` context (``"auto"``: from the environment)."""
    from kvbridge.fit.calibrate import CalibrationConfig, check_same_tokens
    from kvbridge.fit.pipeline import Provenance, fit
    from kvbridge.plugins import get_host

    host = host or get_host()
    prepared = prepared or prepare(settings, data=data, host=host)
    src, tgt, s = pair.source, pair.target, settings
    options, sweep = prepared.options, None
    if s.sweep or s.top_k == "all":
        sweep = list(s.top_k) if s.sweep else "all"
    elif s.top_k is None and "top_k" not in prepared.values and hasattr(options, "top_k"):
        layers = src.spec.num_layers
        if options.top_k > layers:  # the default, larger than the source allows: clamp and say so
            note = (
                f"--top-k defaults to {options.top_k}, but {src.ref.ref} has {layers} layers: using "
                f"--top-k {layers} (all of them)"
            )
            if warn is None:
                import warnings

                warnings.warn(note, UserWarning, stacklevel=2)
            else:
                warn(note)
            options = replace(options, top_k=layers)
    check_budget(s.fitter, options, src.spec, tgt.spec, sweep)
    texts = prepared.data
    if isinstance(texts, (list, tuple)) and all(isinstance(t, str) for t in texts):
        check_same_tokens(list(texts), src.tokenizer, tgt.tokenizer)
    calibration = CalibrationConfig(
        stride=s.stride,
        skip=s.skip,
        heldout=s.heldout,
        seed=s.seed,
        batch_size=s.batch_size,
        seq_len=s.seq_len,
        tokens=s.tokens,
        offset=s.tokens_offset,
    )
    return fit(
        src.model,
        tgt.model,
        texts,
        fitter=s.fitter,
        options=options,
        calibration=calibration,
        tokenizer=src.tokenizer,
        tokenizer_fingerprint=pair.tokenizer,
        corpus_sha256=prepared.corpus_sha256,
        corpus_path=s.corpus if data is None else None,
        corpus_split=prepared.split,
        out=s.out,
        overwrite=s.overwrite,
        resume=s.resume,
        provenance=Provenance(src.name, tgt.name, _revision(src.ref), _revision(tgt.ref)),
        progress=progress,
        distributed=distributed,
        keep_stats=s.keep_stats,
        host=host,
        **({"top_k": sweep} if sweep is not None else {}),
    )


def check_budget(fitter: str, options, source_spec, target_spec, sweep=None) -> None:
    """Refuse, before any pass over the corpus, a statistics budget (``--memory``) below the smallest
    one the ridge fitters can block the fit into (:func:`kvbridge.fit.plan.minimum_budget`), naming it."""
    budget = getattr(options, "memory_budget", None)
    if fitter not in ("ridge", "ridge-headwise") or budget is None:
        return
    from kvbridge.fit.plan import budget_refusal, minimum_budget

    layers = source_spec.num_layers
    ks = [layers if k == "all" else int(k) for k in (sweep if isinstance(sweep, list) else [])]
    k = max(ks) if ks else (layers if sweep == "all" else int(getattr(options, "top_k", layers) or layers))
    fs, ft = source_spec.num_kv_heads * source_spec.head_dim, target_spec.num_kv_heads * target_spec.head_dim
    minimum = minimum_budget(fitter, layers, target_spec.num_layers, fs, source_spec.head_dim, ft, k)
    if minimum > int(budget):
        what = f"the {fitter} fit" + (f" (top-k {min(k, layers)})" if fitter == "ridge" else "")
        raise ConfigError(*budget_refusal(what, int(budget), minimum))


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
    from kvbridge.fit.plan import plan

    k = plan_top_k(settings, source)
    s, rates = settings, None
    if s.plan_device:
        from kvbridge.fit.plan_rates import measure_rates

        rates = measure_rates(
            source,
            target,
            seq_len=s.seq_len,
            batch_size=s.batch_size,
            stride=s.stride,
            top_k=k,
            dtype=s.dtype,
            device=s.plan_device,
        )
    fit_plan = plan(
        source,
        target,
        fitter=s.fitter,
        top_k=k,
        tokens=s.tokens,
        seq_len=s.seq_len,
        stride=s.stride,
        skip=s.skip,
        heldout=s.heldout,
        batch_size=s.batch_size,
        dtype=s.dtype,
        memory_budget=None if s.memory_gib is None else int(s.memory_gib * 2**30),
        device_flops=s.device_flops,
        rates=rates,
        **_plan_options(s),
    )
    from kvbridge.check.measured import measured_for, names_of
    from kvbridge.models import resolve

    measured = measured_for(names_of(resolve(source)), names_of(resolve(target)))
    return replace(fit_plan, measured=tuple(measured)) if measured else fit_plan


def _plan_options(settings: FitSettings) -> dict:
    """The ridge options the plan depends on (``-o support=``, ``-o weighting=``)."""
    opts = dict(o.split("=", 1) for o in settings.fitter_options if "=" in o)
    return {k: opts[k] for k in ("support", "weighting") if k in opts}


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
    idents = [model_identity(resolve(ref, host=host).config) for ref in (source, target)]  # configs only
    top_k = ",".join(map(str, s.top_k)) if s.sweep else s.top_k
    return fit_from_stats(
        s.from_stats,
        out=s.out,
        top_k=top_k,
        alpha=s.alpha,
        source=idents[0],
        target=idents[1],
        overwrite=s.overwrite,
        host=host,
    )


__all__ = [
    "FitSettings",
    "Prepared",
    "prepare",
    "fit_pair",
    "check_budget",
    "plan_fit",
    "plan_top_k",
    "refit",
    "option_values",
]
