"""How good is a transferred cache? ``kvbridge eval`` as a Python API.

::

    from kvbridge.evaluate import evaluate, corpus_samples
    samples, info = corpus_samples("corpus.txt", tokenizer, n=32, length=64 + 32 + 1)
    result = evaluate(source_model, target_model, mapping, samples, prefix_len=64, continuation_len=32)
    result["conditions"]["transferred"]["gap_recovered"], result["gates"]

Modules: :mod:`~kvbridge.evaluate.conditions` (native, transferred, no_prefix and the
controls, run on the same samples; attention capture), :mod:`~kvbridge.evaluate.metrics`
(the metric functions, paired bootstrap), :mod:`~kvbridge.evaluate.gates` (PASS/FAIL),
:mod:`~kvbridge.evaluate.report` (terminal table, JSON, Markdown + PNG report) and
:mod:`~kvbridge.evaluate.guard` (the guarded hand-off for live input).

The result is a JSON-ready dict with stable keys (``SCHEMA``):
``conditions.<condition>.<metric>`` and ``conditions.<condition>.<metric>_ci`` = ``[low, high]``
for every metric, ``conditions.<condition>.attention_cosine_layers`` (per target layer),
``comparisons.transferred_vs_<condition>.nll_diff[_ci]``, ``gates`` (one record per gate),
``gates_passed``, ``timing``, ``samples``, ``prefix_len``, ``continuation_len``, ``greedy_tokens``,
``bootstrap``, ``source``, ``target``, ``mapping``, ``data``, ``definitions``, ``notes``. Values that do not
apply are ``null``.

Importing this package imports nothing heavy.
"""

from __future__ import annotations

from pathlib import Path

# HELDOUT_FRACTION: the share of the corpus (its end) samples come from
from kvbridge.evaluate.settings import HELDOUT_FRACTION, EvalError, EvalSettings

SCHEMA = "kvbridge-eval/1"


def heldout_text(texts, fraction: float = HELDOUT_FRACTION) -> str:
    """The last ``fraction`` of the corpus characters, starting at a line start.

    The zoo trains on the first 90% of its corpus (``base`` 0-75%, ``tuned`` 75-90%) and fits
    should calibrate on the front of a corpus: the tail is what evaluation reads.
    """
    from kvbridge.corpus import heldout_start

    text = texts if isinstance(texts, str) else "\n".join(texts)
    if not 0 < fraction <= 1:
        raise EvalError(f"held-out fraction must be in (0, 1], got {fraction}", "use e.g. 0.1")
    return text[heldout_start(text, fraction) :]


def windows(stream, n: int, length: int):
    """``[n, length]`` non-overlapping windows spread evenly over a 1-D token stream."""
    import torch

    stream = torch.as_tensor(stream).long().flatten()
    total = stream.numel()
    if n < 1:
        raise EvalError(f"--samples must be at least 1, got {n}", "use e.g. --samples 32")
    if total < n * length:
        raise EvalError(
            f"the held-out text has {total} tokens, fewer than {n} samples x {length} tokens",
            "pass a bigger corpus, fewer --samples or a shorter --prefix-len/--continuation-len",
        )
    step = (total - length) / max(1, n - 1) if n > 1 else 0
    starts = [int(round(i * step)) for i in range(n)]
    return torch.stack([stream[s : s + length] for s in starts])


def corpus_samples(corpus, tokenizer, *, n: int, length: int, fraction: float = HELDOUT_FRACTION):
    """``(samples [n, length], info)`` from the held-out tail of a corpus (path or texts)."""
    import torch

    sha = None
    if isinstance(corpus, (str, Path)) and Path(corpus).exists():
        from kvbridge.corpus import load_corpus

        texts, sha = load_corpus(corpus)
    else:
        texts = [corpus] if isinstance(corpus, str) else list(corpus)
    tail = heldout_text(texts, fraction)
    ids = tokenizer(tail, add_special_tokens=False)["input_ids"]
    info = {
        "kind": "corpus",
        "path": str(corpus) if isinstance(corpus, (str, Path)) else None,
        "sha256": sha,
        "heldout_fraction": fraction,
        "heldout_tokens": len(ids),
    }
    return windows(torch.tensor(ids, dtype=torch.long), n, length), info


def model_samples(model, *, n: int, length: int, seed: int = 0, bos: int | None = None, temperature: float = 1.0):
    """``[n, length]`` token ids sampled from ``model`` (seeded ancestral sampling, temperature 1).

    For when no corpus is available: text drawn from the model itself, deterministic per seed.
    """
    import torch

    from kvbridge.evaluate.runner import decode

    g = torch.Generator().manual_seed(int(seed))
    start = bos if bos is not None else getattr(model.config, "bos_token_id", None)
    if start is None:
        first = torch.randint(0, model.config.vocab_size, (n, 1), generator=g)
    else:
        first = torch.full((n, 1), int(start), dtype=torch.long)

    def sample(logits):
        return torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=g)

    return decode(model, None, first, length - 1, sample)


def model_info(model, spec, name: str = "") -> dict:
    """A result's record of a model: ``name`` (default: its config's path), type and cache geometry."""
    return {
        "name": name or str(getattr(model.config, "_name_or_path", "") or ""),
        "model_type": spec.model_type,
        "layers": spec.num_layers,
        "kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "dtype": spec.dtype,
    }


def _describe_mapping(mapping, path=None) -> dict:
    report = getattr(mapping, "report", None)
    return {
        "path": None if path is None else str(path),
        "name": getattr(mapping, "name", type(mapping).__name__),
        "exact": bool(getattr(mapping, "exact", False)),
        "layer_selection": mapping.layer_selection() if hasattr(mapping, "layer_selection") else None,
        "r2_summary": getattr(report, "r2_summary", None),
        "heldout_r2": getattr(report, "heldout_r2", None),
        "warnings": list(getattr(report, "warnings", None) or []),
    }


def eval_config(config=None, **fields):
    """An :class:`~kvbridge.evaluate.settings.EvalSettings` (``config``, default ``kvbridge eval``'s)
    with ``fields`` replaced by name (``prefix_len=48``); an unknown name is refused naming the closest."""
    from dataclasses import fields as fields_of, replace

    from kvbridge.errors import did_you_mean

    known = [f.name for f in fields_of(EvalSettings)]
    for key in fields:
        if key not in known:
            raise EvalError(
                f"evaluate() has no setting {key!r}", f"{did_you_mean(key, known)}settings: {', '.join(known)}"
            )
    config = config or EvalSettings()
    return replace(config, **fields) if fields else config


def evaluate(source, target, mapping, samples, *, config=None, gates=None, metrics=None, host=None, **settings) -> dict:
    """Run every condition on ``samples`` and return the JSON-ready result (see the module docstring).

    ``config``: an :class:`~kvbridge.evaluate.settings.EvalSettings` (default: ``kvbridge eval``'s);
    ``settings`` replace its fields by name (``prefix_len=48``; checked as the settings check them),
    ``source_name``, ``target_name``, ``mapping_path``, ``data`` label the result, and ``progress`` /
    ``on_batch`` are the callbacks of :func:`evaluate_config`. ``gates``: gate texts to enforce
    (``"kl_p95<=0.2"``, ``"default"``; default: the settings' ``gates``); the default gates are always
    reported. ``metrics``: metric names (default: every registered metric).
    """
    calls = {k: settings.pop(k) for k in ("progress", "on_batch") if k in settings}
    labels = {k: settings.pop(k) for k in LABELS if k in settings}
    config = eval_config(config, **settings)
    return evaluate_config((source, target), mapping, samples, config, gates, metrics, host, labels=labels, **calls)


#: what labels an eval result beside the numbers (keywords of :func:`evaluate`)
LABELS = ("source_name", "target_name", "mapping_path", "data")


def evaluate_config(
    models, mapping, samples, config, gates=None, metrics=None, host=None, progress=None, on_batch=None, labels=None
):
    """:func:`evaluate` with ``config`` an :class:`~kvbridge.evaluate.settings.EvalSettings` as it is
    (``kvbridge eval`` passes its own); ``models``: ``(source, target)``; ``labels``: :data:`LABELS` by name."""
    from kvbridge.evaluate import gates as gates_mod
    from kvbridge.evaluate.conditions import run_conditions
    from kvbridge.evaluate.metrics import resolve_metrics, summarize
    from kvbridge.plugins import get_host
    from kvbridge.progress import json_ready
    from kvbridge.stats import ratio

    source, target = models
    labels = labels or {}
    host = host or get_host()
    loaded = resolve_metrics(host, metrics)
    hib = {m.name: m.higher_is_better for m in loaded}
    # parse before the (slow) run: fail early on a typo
    gate_list = gates_mod.gate_set(config.gates if gates is None else gates, hib)
    run = run_conditions(source, target, mapping, samples, config, host=host, progress=progress, on_batch=on_batch)
    summary = summarize(run, loaded, bootstrap=config.bootstrap, seed=config.seed)
    gate_results = gates_mod.evaluate_gates(summary, gate_list)
    t = run.timing
    timing = {
        "eval_seconds": t["eval_s"],
        "target_prefill_ms": 1e3 * t["target_prefill_s"],
        "transfer_ms": 1e3 * t["transfer_s"],
        "source_prefill_ms": 1e3 * t["source_prefill_s"],
        "prefix_tokens": t["prefix_tokens"],
        "transfer_speedup_vs_prefill": ratio(t["target_prefill_s"], t["transfer_s"]),
        # the figure for a source that does not already hold the cache: it must prefill first
        "transfer_speedup_with_source_prefill": ratio(t["target_prefill_s"], t["source_prefill_s"] + t["transfer_s"]),
    }
    result = {
        "schema": SCHEMA,
        "source": model_info(source, host.adapter_of(source).spec_of(source), labels.get("source_name", "")),
        "target": model_info(target, host.adapter_of(target).spec_of(target), labels.get("target_name", "")),
        "mapping": _describe_mapping(mapping, labels.get("mapping_path")),
        "data": labels.get("data") or {"kind": "token ids"},
        "samples": run.num_samples,
        **{
            k: getattr(config, k)
            for k in ("prefix_len", "continuation_len", "greedy_tokens", "top_k", "top_p", "bootstrap", "seed")
        },
        "conditions": summary["conditions"],
        "comparisons": summary["comparisons"],
        "gates": gate_results,
        "gates_passed": all(r["passed"] for r in gate_results),
        "exit_code": gates_mod.exit_code(gate_results),
        "timing": timing,
        "higher_is_better": summary["higher_is_better"],
        "definitions": summary["descriptions"],
        "notes": list(run.notes),
    }
    return json_ready(result, stringify=False)


__all__ = [
    "SCHEMA",
    "HELDOUT_FRACTION",
    "evaluate",
    "evaluate_config",
    "eval_config",
    "corpus_samples",
    "model_samples",
    "heldout_text",
    "windows",
    "model_info",
]
