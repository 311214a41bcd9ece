"""The four ``kvbridge steer`` subcommands as one library call each (nothing is printed here).

Each takes a :class:`~kvbridge.run.Run` of its settings (:mod:`kvbridge.steer.settings`):

- :func:`build_steering` (``run.model``, :class:`~kvbridge.steer.settings.SteerBuildSettings`): a vector folder;
- :func:`transfer_steering` (``run.pair``, :class:`~kvbridge.steer.settings.SteerTransferSettings`): a vector
  moved from the pair's source to its target through a fitted mapping;
- :func:`run_steering` (``run.model``, :class:`~kvbridge.steer.settings.SteerRunSettings`): one prompt steered
  and unsteered;
- :func:`evaluate_steering` (``run.model``, :class:`~kvbridge.steer.settings.SteerEvalSettings`): the arms of
  ``steer eval``, and its report folder.

``run.model`` is a :class:`~kvbridge.models.loading.LoadedModel` (its ``tokenizer`` the one to use).
Each ``prepare_*`` does what can be refused before a model loads (a replaceable ``out``, the vector
folders, method options, the scorer); the call runs it when not given its result.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

from kvbridge.artifacts import atomic_dir, check_replaceable
from kvbridge.errors import ConfigError
from kvbridge.plugins import host_or_default
from kvbridge.steer.artifact import KIND, load_vector, read_vector, save_vector
from kvbridge.steer.prompts import chat_mode, guide_scenario, guide_texts, prompt_scenario, split_scenario
from kvbridge.steer.settings import SWEPT, SteerBuildSettings, SteerEvalSettings, SteerRunSettings
from kvbridge.steer.settings import SteerTransferSettings

#: the kind of a ``steer eval --out`` report folder
REPORT_KIND = "kvbridge.steer-eval"
#: run settings fields -> method option keys (passed only when given and when the method has the option)
SHORTCUTS = {"ck": "ck", "cv": "cv", "alpha": "alpha", "ca": "coefficient"}


def _tokenizer_fp(model, tokenizer_path=None) -> dict:
    from kvbridge.models.fingerprint import loaded_tokenizer_identity

    return loaded_tokenizer_identity(model, tokenizer_path, model.tokenizer)


# -- build ---------------------------------------------------------------------------------------------
def prepare_build(settings: SteerBuildSettings):
    """The contrastive pairs, read and checked, with ``out`` replaceable."""
    from kvbridge.steer.pairs import read_pairs

    check_replaceable(settings.out, KIND, overwrite=settings.overwrite)
    return read_pairs(settings.pairs)


def build_steering(run, *, pairs=None) -> tuple[Path, dict]:
    """``(folder, manifest)`` of the vector built for ``run.model`` from ``run.settings.pairs``."""
    from kvbridge.steer.vectors import build_vector

    s, model, host = run.settings, run.model, run.host
    pairs = pairs if pairs is not None else prepare_build(s)
    m, tok = model.model, model.tokenizer
    vector = build_vector(m, tok, pairs, position=s.position, method=s.method, key_space=s.key_space, host=host)
    path = save_vector(vector, s.out, m, tokenizer_fp=_tokenizer_fp(model, s.tokenizer), overwrite=s.overwrite)
    return path, read_vector(path)[0]


# -- transfer ------------------------------------------------------------------------------------------
def prepare_transfer(settings: SteerTransferSettings) -> None:
    """``out`` replaceable and the vector folder readable."""
    check_replaceable(settings.out, KIND, overwrite=settings.overwrite)
    read_vector(settings.vector)


def transfer_steering(run, *, prepared: bool = False) -> tuple[Path, Any]:
    """``(folder, mapping)``: the vector of ``run.source`` moved to ``run.target`` through ``settings.mapping``
    (checked against both models and the pair's tokenizer)."""
    from kvbridge.evaluate.run import mapping_of
    from kvbridge.steer.vectors import transfer_vector

    settings, src, tgt, host = run.settings, run.source, run.target, run.host
    if not prepared:
        prepare_transfer(settings)
    vector = load_vector(settings.vector, src.model, host=host)
    mapping = mapping_of(run)
    moved = transfer_vector(vector, mapping, tgt.spec)
    path = save_vector(moved, settings.out, tgt.model, tokenizer_fp=_tokenizer_fp(tgt), overwrite=settings.overwrite)
    return path, mapping


# -- run -----------------------------------------------------------------------------------------------
def method_values(settings: SteerRunSettings, host=None) -> dict:
    """The method options from ``settings.options`` and the shortcut fields that were given; a shortcut
    the method does not have is refused naming its options."""
    from kvbridge.fit.protocol import option_fields, parse_pairs

    values = parse_pairs(settings.options)
    fields = option_fields(host_or_default(host).get("steering_method", settings.method).Options)
    for name, key in SHORTCUTS.items():
        value = getattr(settings, name)
        if value is None:
            continue
        if key not in fields:
            raise ConfigError(
                f"--{name} does not apply to steering method {settings.method!r}",
                f"its options: {', '.join(fields) or 'none'}",
            )
        if key in values:
            raise ConfigError(f"option {key} is given twice (a flag and -o {key}=...)", "give it once")
        values[key] = value
    return values


def prepare_run(settings: SteerRunSettings, host=None) -> dict:
    """The method options, checked, and the vector folder readable."""
    values = method_values(settings, host)
    if settings.vector:
        read_vector(settings.vector)
    return values


def _scenario(model, settings: SteerRunSettings, chat: bool):
    """``(scenario, prefix state or None)`` of where ``settings.at`` puts the edit."""
    tok, s = model.tokenizer, settings
    if s.at == "last":
        return prompt_scenario(tok, s.prompt, chat=chat), None
    if s.at == "guide":
        return guide_scenario(tok, s.guide, s.prompt, chat=chat), None
    from kvbridge.prefix.packs import load_pack

    pack = load_pack(s.pack, model.model, tokenizer=tok, tokenizer_fp=_tokenizer_fp(model))
    live_text = guide_texts(tok, "x", s.prompt, chat=chat)[1] if chat else s.prompt
    report, split = pack.split_for(tok, live_text, "" if chat else "\n")
    return split_scenario(report, split, report.text), pack.state_for(model.model)


def run_steering(run, *, values: dict | None = None) -> dict:
    """The unsteered and steered continuations of ``run.settings.prompt`` on ``run.model`` (same seed;
    JSON-ready), with the ``steering`` record and whether the steered cache is marked ``approximate``."""
    from kvbridge.steer.run import check_length, prefix_state, run_pair, setup_for

    s, model, host = run.settings, run.model, run.host
    values = values if values is not None else prepare_run(s, host)
    m, tok = model.model, model.tokenizer
    vector = load_vector(s.vector, m, tokenizer_fp=_tokenizer_fp(model), host=host) if s.vector else None
    use_chat = chat_mode(tok, s.chat)
    scenario, prefix = _scenario(model, s, use_chat)
    check_length(m, scenario, s.max_new_tokens, host)
    other = None if s.other is None else prefix_state(m, prompt_scenario(tok, s.other, chat=use_chat).prefix_ids, host)
    setup = partial(setup_for, m, scenario, prefix=prefix, host=host)
    base, _ = setup()
    steered, record = setup(method=s.method, options=values, vector=vector, other=other, layers=s.layers)
    approximate = bool(steered.prefix is not None and steered.prefix.approximate)
    return {**run_pair(m, tok, base, steered, s, host), "steering": record, "approximate": approximate}


# -- eval ----------------------------------------------------------------------------------------------
def prepare_eval(settings: SteerEvalSettings, host=None) -> Callable[[str], bool]:
    """The scorer, resolved, with ``out`` replaceable and every vector folder readable."""
    if settings.out:
        check_replaceable(settings.out, REPORT_KIND, overwrite=settings.overwrite)
    score = host_or_default(host).get("scorer", settings.scorer)
    for path in (settings.vector, *settings.extra_vectors.values()):
        read_vector(path)
    return score


def evaluate_steering(run, *, prepared: Callable | None = None, log: Callable[[str], None] | None = None) -> dict:
    """Every arm of ``steer eval`` on ``run.model`` (see :mod:`kvbridge.steer.evaluate`); the result is
    JSON-ready; with ``settings.out`` the report folder is written (atomically). ``prepared``: the scorer
    :func:`prepare_eval` returned (resolved here when not given)."""
    from kvbridge.steer.evaluate import evaluate, lines, plot_sweep

    s, model, host = run.settings, run.model, run.host
    prepared = prepared if prepared is not None else prepare_eval(s, host)
    m, tok = model.model, model.tokenizer
    fp = _tokenizer_fp(model)
    vector = load_vector(s.vector, m, tokenizer_fp=fp, host=host)
    extra = {name: load_vector(path, m, tokenizer_fp=fp, host=host) for name, path in s.extra_vectors.items()}
    arms = replace(
        s, arms=s.arms + tuple(n for n in extra if n not in s.arms), sweep_arms=s.sweep_arms or SWEPT + tuple(extra)
    )
    result = evaluate(m, tok, vector, scorer=prepared, settings=arms, extra_vectors=extra, host=host, log=log)
    result["model"] = model.ref.ref
    result["vector_dir"] = str(s.vector)
    if s.out:
        with atomic_dir(s.out, kind=REPORT_KIND, overwrite=s.overwrite) as tmp:
            (tmp / "report.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
            (tmp / "report.md").write_text("\n".join(lines(result)) + "\n")
            plot_sweep(result, tmp / "sweep.png", title=f"{result['model']}: {s.scorer}")
    return result
