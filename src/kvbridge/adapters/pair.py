"""Base -> base+adapter through check, fit and eval: is a base model's cache reusable by its LoRA?

:func:`run_adapter_pair` measures, on the same held-out samples (the last 10% of the corpus):

- ``native``: base+adapter's own prefill of the prefix (the ceiling);
- ``plain reuse``: the base model's prefix cache given to base+adapter as it is (the identity
  mapping: RoPE stripped and re-applied, no fit), what a serving stack does when it shares a
  prefix cache across adapters of one base;
- ``fitted``: the base cache through a ridge mapping fitted on calibration text from the front of
  the corpus (``[0, 0.25)``, disjoint from the adapter's training slice and from the evaluation);
- ``no_prefix``: base+adapter fed the continuation alone (the floor).

Every metric and its interval come from :mod:`kvbridge.evaluate` (paired bootstrap over the
samples, the same resamples for every row). On top of the per-row intervals the result holds
paired bootstrap intervals of the *differences* fitted - plain and x - native for NLL and mean
KL: :meth:`AdapterPairResult.ordering` states only the orderings those intervals separate.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvbridge.adapters import DEFAULT_CORPUS, AdapterError, load_adapter_pair
from kvbridge.evaluate.report import fmt, fmt_ci, md_table, text_table

#: the fit's calibration text: the front quarter of the corpus (the adapter trained on [0.5, 0.7))
CALIBRATION_SLICE = (0.0, 0.25)
ROWS = ("native", "fitted", "plain", "no_prefix")
ROW_LABELS = {
    "native": "native (base+adapter prefill)",
    "fitted": "fitted (ridge map of the base cache)",
    "plain": "plain reuse (base cache, identity, no fit)",
    "no_prefix": "no prefix",
}
METRICS = ("nll", "gap_recovered", "kl_mean", "kl_p95", "top1_agreement", "greedy_agreement", "attention_cosine_min")


@dataclass(frozen=True)
class AdapterPairResult:
    """The measured rows (``conditions[row][metric]``, ``..._ci``), paired differences, settings."""

    check_verdict: str
    check_reasons: tuple
    adapter: dict  # path, rank, alpha, targets, sha256, held-out loss of the recipe
    conditions: dict  # row -> {metric: value, metric_ci: [lo, hi]}
    differences: dict  # "fitted-plain" / "fitted-native" / "plain-native" -> {nll: [d, lo, hi], kl_mean: [...]}
    gates: dict  # row -> list of gate records (default gates)
    mapping: dict  # the fitted mapping's held-out R², layer selection
    settings: dict
    timing: dict
    data: dict
    notes: tuple = field(default_factory=tuple)

    def separated(self, a: str, b: str, metric: str = "nll") -> int:
        """-1 when ``a`` is reliably lower than ``b`` on ``metric`` (interval of a-b below 0), +1 above, 0 tie."""
        key, sign = (f"{a}-{b}", 1) if f"{a}-{b}" in self.differences else (f"{b}-{a}", -1)
        _d, lo, hi = self.differences[key][metric]
        return -sign if hi < 0 else sign if lo > 0 else 0

    def ordering(self, metric: str = "nll") -> list[str]:
        """The orderings (lower is better) that the paired intervals separate, e.g. ``native < fitted``."""
        pairs = (("native", "fitted"), ("native", "plain"), ("fitted", "plain"))
        signs = [(a, b, self.separated(a, b, metric)) for a, b in pairs]
        return [
            f"{a} < {b}" if s < 0 else f"{b} < {a}" if s > 0 else f"{a} ~ {b} (interval spans 0)" for a, b, s in signs
        ]

    def table_rows(self) -> list[list[str]]:
        def row(r, c):
            return [
                ROW_LABELS[r],
                f"{fmt(c['nll'])} {fmt_ci(c['nll_ci'])}",
                f"{fmt(c['gap_recovered'], '{:+.3f}')} {fmt_ci(c['gap_recovered_ci'], '{:+.2f}')}",
                f"{fmt(c['kl_mean'], '{:.4f}')} {fmt_ci(c['kl_mean_ci'], '{:.4f}')}",
                fmt(c["kl_p95"], "{:.4f}"),
                *(fmt(c[m]) for m in ("top1_agreement", "greedy_agreement", "attention_cosine_min")),  # {:.3f}
                self._gate_text(r),
            ]

        return [row(r, self.conditions[r]) for r in ROWS]

    HEADS = ("row", "NLL [95% CI]", "gap_recovered [95% CI]", "KL mean [95% CI]", "kl_p95", "top1", "greedy")
    HEADS += ("attn cos min", "default gates")

    def _gate_text(self, row: str) -> str:
        recs = self.gates.get(row)
        if not recs:
            return "n/a"
        bad = [g["metric"] for g in recs if not g["passed"]]
        return "PASS" if not bad else "FAIL (" + ", ".join(bad) + ")"

    def diff_lines(self) -> list[str]:
        return [
            f"{key}: " + "; ".join(f"{m} {v[0]:+.4f} [{v[1]:+.4f}, {v[2]:+.4f}]" for m, v in d.items())
            for key, d in self.differences.items()
        ]

    def _header(self) -> list[str]:
        a, s = self.adapter, self.settings
        held = a.get("heldout") or {}
        lines = [
            f"pair: {s['base']} -> {s['base']}+LoRA (rank {a['rank']}, alpha {a['alpha']:g}, "
            f"{'/'.join(a['targets'])}; {Path(a['path']).name})",
            f"check: {self.check_verdict}" + (f" ({self.check_reasons[0]})" if self.check_reasons else ""),
        ]
        if held:
            lines.append(
                f"adapter held-out NLL (recipe, {held.get('heldout_windows')} windows): base "
                f"{held['base_nll']:.4f}, base+adapter {held['adapter_nll']:.4f} "
                f"({held['nll_diff_mean']:+.4f} +- {held['nll_diff_se']:.4f} se)"
            )
        m = self.mapping
        lines.append(
            f"fit: ridge top-k {s['top_k']}, stride {s['stride']}, {s['calibration_tokens']} calibration tokens "
            f"(corpus {CALIBRATION_SLICE[0]:.2f}-{CALIBRATION_SLICE[1]:.2f}); held-out R2 mean "
            f"{m.get('r2_mean', float('nan')):.4f} (min {m.get('r2_min', float('nan')):.4f}); layer selection "
            f"{'diagonal' if m.get('diagonal') else 'not diagonal'}"
        )
        lines.append(
            f"eval: {s['samples']} held-out samples (corpus tail), prefix {s['prefix_len']}, continuation "
            f"{s['continuation_len']}, greedy {s['greedy_tokens']}; {s['bootstrap']} paired bootstrap resamples"
        )
        return lines

    def render(self) -> str:
        lines = self._header() + [
            "",
            *text_table(self.HEADS, self.table_rows(), right=False),
            "",
            "paired differences (x - y, bootstrap 95%):",
        ]
        lines += ["  " + line for line in self.diff_lines()]
        lines.append("ordering by NLL (only where the paired interval excludes 0): " + "; ".join(self.ordering("nll")))
        lines.append("ordering by KL to native: " + "; ".join(self.ordering("kl_mean")))
        t = self.timing
        lines.append(
            f"time: load {t.get('load_s', 0):.1f} s, check {t['check_s']:.1f} s, fit {t['fit_s']:.1f} s, "
            f"eval {t['eval_s']:.1f} s"
        )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = [f"- {line}" for line in self._header()] + [
            "",
            *md_table(self.HEADS, self.table_rows()),
            "",
            "Paired differences (x - y, bootstrap 95%):",
            "",
        ]
        lines += [f"- {line}" for line in self.diff_lines()]
        lines += [
            "",
            "Ordering by NLL (only where the paired interval excludes 0): " + "; ".join(self.ordering("nll")),
            "",
            "Ordering by KL to native: " + "; ".join(self.ordering("kl_mean")),
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        from kvbridge.progress import json_ready

        return json_ready(asdict(self), stringify=False)


def calibration_ids(tokenizer, text: str, tokens: int, seq_len: int = 128):
    """``[n, seq_len]`` ids from the front of the corpus (``CALIBRATION_SLICE``)."""
    import torch

    from kvbridge.corpus import slice_text

    front = slice_text(text, *CALIBRATION_SLICE)
    n = max(2, tokens // seq_len)
    ids = tokenizer(front[: tokens * 8], add_special_tokens=False)["input_ids"][: n * seq_len]
    if len(ids) < n * seq_len:
        raise AdapterError(
            f"the calibration slice gives {len(ids)} tokens, fewer than {n * seq_len}",
            "lower calibration tokens or pass a bigger corpus",
        )
    return torch.tensor(ids, dtype=torch.long).view(n, seq_len)


def _paired_diff(fields_a: dict, fields_b: dict, idx, params: dict) -> dict:
    from kvbridge.evaluate.metrics import EvalView, kl_mean, nll, percentile_interval

    out = {}
    for name, fn in (("nll", nll), ("kl_mean", kl_mean)):
        point = float(fn(EvalView.of("a", fields_a, params))[0] - fn(EvalView.of("b", fields_b, params))[0])
        reps = fn(EvalView.resampled("a", fields_a, idx, params)) - fn(EvalView.resampled("b", fields_b, idx, params))
        out[name] = [point, *percentile_interval(reps)]
    return out


@dataclass(frozen=True)
class AdapterPairSettings:
    """One adapter-pair run (``python -m kvbridge.adapters.pair``): the corpus (default
    :data:`kvbridge.adapters.DEFAULT_CORPUS`), the held-out samples, the ridge fit on the corpus front
    (``calibration_tokens``, ``top_k``, ``stride``), the bootstrap; ``controls``: also run the evaluate
    controls (zeroed, shuffled, random, no_rope_reapply) on the fitted mapping (slower; their rows go into
    ``conditions`` as ``fitted:<control>``)."""

    corpus: str | None = None
    samples: int = 32
    prefix_len: int = 64
    continuation_len: int = 8
    greedy_tokens: int = 8
    calibration_tokens: int = 4096
    top_k: int = 1
    stride: int = 4
    bootstrap: int = 1000
    seed: int = 0
    batch_size: int = 16
    controls: bool = False


def run_adapter_pair(pair=None, settings=None, *, host=None, progress=None) -> AdapterPairResult:
    """Check, fit and evaluate base -> base+adapter (see the module docstring).

    ``pair``: an :class:`~kvbridge.adapters.AdapterPair` (default: the shipped one, loaded here);
    ``settings``: an :class:`AdapterPairSettings` (default: its defaults).
    """
    import torch

    from kvbridge.family_adapter import weights_fingerprint
    from kvbridge.check.compat import Side, check
    from kvbridge.evaluate import corpus_samples
    from kvbridge.evaluate import gates as gates_mod
    from kvbridge.evaluate.conditions import ConditionRun, run_conditions
    from kvbridge.evaluate.settings import CONTROLS, EvalSettings
    from kvbridge.evaluate.metrics import bootstrap_indices, resolve_metrics, summarize
    from kvbridge.fit import FitSettings, fit_run
    from kvbridge.harness.conditions import plain_condition
    from kvbridge.plugins import get_host
    from kvbridge.run import model_run

    host = host or get_host()
    st = settings if settings is not None else AdapterPairSettings()
    timing: dict = {}
    t0 = time.perf_counter()
    pair = pair if pair is not None else load_adapter_pair()
    timing["load_s"] = time.perf_counter() - t0
    base, tuned, tok = pair.base, pair.tuned, pair.tokenizer
    corpus = Path(st.corpus or DEFAULT_CORPUS)
    if not corpus.is_file():
        raise AdapterError(f"corpus not found at {corpus}", "pass corpus= a text file (tinyshakespeare.txt)")

    t0 = time.perf_counter()
    names = (pair.base_name, f"{pair.base_name}+adapter")
    run = model_run(base, tuned, FitSettings(top_k=st.top_k, stride=st.stride, seed=st.seed), host, names=names)
    side_names = (pair.base_name, f"{pair.base_name}+{Path(pair.adapter.path).name}")
    sides = [
        Side(m.spec, name=n, config=m.model.config.to_dict(), weights=weights_fingerprint(m.model))
        for m, n in zip((run.source, run.target), side_names)
    ]
    report = check(*sides, host=host)
    timing["check_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    calib = calibration_ids(tok, corpus.read_text(encoding="utf-8"), st.calibration_tokens)
    mapping = fit_run(run, data=calib, distributed=None)
    timing["fit_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    ids, data = corpus_samples(corpus, tok, n=st.samples, length=st.prefix_len + st.continuation_len + 1)
    conds = ("native", "transferred", "no_prefix") + (CONTROLS if st.controls else ())
    shared = ("prefix_len", "continuation_len", "greedy_tokens", "batch_size", "seed")
    cfg = EvalSettings(**{k: getattr(st, k) for k in shared}, conditions=conds)
    # plain reuse: the same source prefill through the identity mapping
    ran = run_conditions(base, tuned, mapping, ids, cfg, host=host, progress=progress, extra=[plain_condition])
    timing["eval_s"] = time.perf_counter() - t0
    names = {"transferred": "fitted", **{c: f"fitted:{c}" for c in conds[3:]}}
    fields = {names.get(k, k): v for k, v in ran.fields.items()}
    fields = {k: fields[k] for k in ("native", "fitted", "plain", "no_prefix", *(f"fitted:{c}" for c in conds[3:]))}
    combined = ConditionRun(config=cfg, fields=fields, num_layers=ran.num_layers, timing=ran.timing)
    metrics = resolve_metrics(host)
    summary = summarize(combined, metrics, bootstrap=st.bootstrap, seed=st.seed)
    params = {"greedy_tokens": st.greedy_tokens, "top_k": cfg.top_k, "top_p": cfg.top_p}
    idx = bootstrap_indices(int(ids.shape[0]), st.bootstrap, st.seed)
    differences = {
        f"{a}-{b}": _paired_diff(fields[a], fields[b], idx, params)
        for a, b in (("fitted", "plain"), ("native", "fitted"), ("native", "plain"))
    }
    gate_list = gates_mod.gate_set((), {m.name: m.higher_is_better for m in metrics})
    gates = {
        r: gates_mod.evaluate_gates({"conditions": {"transferred": summary["conditions"][r]}}, gate_list)
        for r in ("fitted", "plain")
    }
    r2, sel = mapping.report.r2_summary, mapping.layer_selection()  # a ridge mapping (FitSettings' fitter)
    diagonal = bool(sel) and all(row and row[0] == i for i, row in enumerate(sel))
    info = {
        "path": pair.adapter.path,
        "rank": pair.adapter.rank,
        "alpha": pair.adapter.alpha,
        "targets": list(pair.adapter.target_modules),
        "sha256": pair.adapter.sha256,
        "heldout": (pair.adapter.recipe or {}).get("result"),
    }
    kept = ("prefix_len", "continuation_len", "greedy_tokens", "bootstrap", "seed", "top_k", "stride")
    settings = {
        "base": pair.base_name,
        "samples": int(ids.shape[0]),
        **{k: getattr(st, k) for k in kept},
        "calibration_tokens": int(calib.numel()),
        "corpus": str(corpus),
        "dtype": str(next(tuned.parameters()).dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
    }
    return AdapterPairResult(
        check_verdict=report.verdict,
        check_reasons=tuple(report.reasons),
        adapter=info,
        conditions={
            k: {m: v for m, v in row.items() if not m.startswith("attention_cosine_layers")}
            for k, row in summary["conditions"].items()
        },
        differences=differences,
        gates=gates,
        mapping={"r2_mean": r2.get("mean"), "r2_min": r2.get("min"), "layer_selection": sel, "diagonal": diagonal},
        settings=settings,
        timing=timing,
        data=data,
        notes=tuple(ran.notes),
    )


def main(argv=None) -> int:
    """``python -m kvbridge.adapters.pair [--samples N ...] [--json FILE] [--markdown]``: the RESULTS.md run."""
    import argparse
    import json
    from dataclasses import fields

    from kvbridge.threads import quiet_torch

    ap = argparse.ArgumentParser(prog="python -m kvbridge.adapters.pair", description=__doc__.split("\n")[0])
    for f in fields(AdapterPairSettings):  # one option per setting, its default the setting's
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            ap.add_argument(flag, action="store_true", help="also the zeroed/shuffled/random/no_rope_reapply controls")
        else:
            ap.add_argument(flag, type=int if isinstance(f.default, int) else str, default=f.default)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    quiet_torch(a.threads)
    t0 = time.perf_counter()
    res = run_adapter_pair(
        settings=AdapterPairSettings(**{f.name: getattr(a, f.name) for f in fields(AdapterPairSettings)})
    )
    print(res.markdown() if a.markdown else res.render())
    print(f"\n({time.perf_counter() - t0:.0f} s in all)")
    if a.json:
        Path(a.json).write_text(json.dumps(res.to_dict(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
