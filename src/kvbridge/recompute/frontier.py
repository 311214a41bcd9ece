"""The compute frontier of a transfer: ``kvbridge eval --frontier R[,R...]``.

Does a transferred cache buy anything over spending the same target compute without it? On the
same held-out samples (prefix ``P``, continuation ``C`` scored by teacher forcing), for each
share ``R`` of the prefix (``k = ceil(R * P)`` tokens, 0 for ``R = 0``) and ``S`` sink tokens:

- ``truncated@R``: the target prefills only the first ``S`` tokens and the last ``k`` tokens of
  the prefix, nothing else: what a user gets at that compute without any transfer. The kept
  tokens keep their **original positions** (the RoPE positions they have in the full prefix:
  ``0..S-1`` and ``P-k..P-1``) and the continuation stays at ``P..P+C-1``, so the only thing
  missing is the dropped middle; ``truncated@1`` is the target's own prefill of the whole prefix;
- ``tail@R``: the same ``S + k`` rows computed by the target at every layer
  (:func:`~kvbridge.recompute.tokens.recompute_rows`, the selective-recompute runner), attending
  to the mapped cache of every other row: the transfer plus that compute. At ``R = 0`` nothing
  is computed (the sinks come with the tail), so ``tail@0`` is the plain transfer, bitwise;
- ``native`` (the ceiling), ``transferred``, ``source`` (the source model continued from its own
  prefill: the small model alone) and ``no_prefix`` (the floor), as ``kvbridge eval`` runs them.

Each row carries its share of the target's prefill FLOPs (:mod:`~kvbridge.recompute.cost`: what
the target computes; the source's own prefill is a separate column, as a share of the same
target prefill), gap recovered with a paired bootstrap interval, and paired differences of gap
recovered (and of NLL) against ``source`` and, for ``tail@R``, against ``truncated@R``. The
verdict is the smallest measured ``R`` at which ``tail@R`` beats both (both intervals above 0),
or "does not pay at any measured point".
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from kvbridge.evaluate.fields import share_closed, summarize_fields
from kvbridge.evaluate.metrics import bootstrap_indices, percentile_interval
from kvbridge.evaluate.runner import Built, Condition, Prefills, sample_ids
from kvbridge.progress import json_ready
from kvbridge.recompute.cost import prefill_flops
from kvbridge.recompute.frontier_report import gap_diff_text
from kvbridge.recompute.settings import RecomputeError
from kvbridge.recompute.tokens import count_for, recompute_rows

SCHEMA = "kvbridge-frontier/1"
#: sink tokens kept at the start of the prefix (``--sink``)
DEFAULT_SINK = 4


def point_name(kind: str, ratio: float) -> str:
    return f"{kind}@{float(ratio):g}"


def kept_rows(prefix_len: int, ratio: float, sink: int, *, tail: bool) -> torch.Tensor:
    """Prefix rows a frontier point computes: the first ``sink`` and the last ``ceil(ratio * P)``.

    ``tail=True`` and ``ratio == 0``: none (``tail@0`` is the plain transfer)."""
    p = int(prefix_len)
    k = count_for(float(ratio), p)
    if tail and k == 0:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(min(int(sink), p - k)), torch.arange(p - k, p)])


def truncated_state(model, state, rows: torch.Tensor):
    """The target's own prefill of ``state``'s tokens at ``rows`` only, at their original positions,
    and its :class:`~kvbridge.recompute.cost.Cost` (``state`` gives the tokens, positions and layout;
    its K/V are not read: every kept row is computed at every layer)."""

    def cut(t):
        return None if t is None else t.expand(state.batch_size, -1)[:, rows]

    kept = replace(
        state,
        keys=tuple(torch.zeros_like(k[:, :, rows]) for k in state.keys),
        values=tuple(torch.zeros_like(v[:, :, rows]) for v in state.values),
        token_ids=state.token_ids[:, rows],
        positions=cut(state.positions),
        rope_lengths=cut(state.rope_lengths),
        approximate=False,
        meta={},
    )
    return recompute_rows(model, kept, torch.arange(len(rows)), meta={"truncated": True})


def paired_differences(fields: dict, pairs, *, bootstrap: int, seed: int) -> dict:
    """``{"x_vs_y": {gap_diff, gap_diff_ci, nll_diff, nll_diff_ci}}``: paired (the same resampled
    samples for both, the indices :func:`kvbridge.evaluate.metrics.summarize` uses for the seed)."""

    def per_sample(cond, name):
        return fields[cond][name].double().flatten(1).mean(1)

    any_cond = next(iter(fields))
    n = int(fields[any_cond]["nll"].shape[0])
    floor, ceil = per_sample(any_cond, "no_prefix_nll"), per_sample(any_cond, "native_nll")
    idx = bootstrap_indices(n, bootstrap, seed) if bootstrap > 0 else None
    whole = torch.arange(n)[None]
    out = {}
    for x, y in pairs:
        a, b = per_sample(x, "nll"), per_sample(y, "nll")

        def diff(sel):
            return share_closed(floor, ceil, a, sel) - share_closed(floor, ceil, b, sel)

        nan = [float("nan")] * 2
        out[f"{x}_vs_{y}"] = {
            "x": x,
            "y": y,
            "gap_diff": float(diff(whole)[0]),
            "gap_diff_ci": percentile_interval(diff(idx)) if idx is not None else nan,
            "nll_diff": float(a.mean() - b.mean()),
            "nll_diff_ci": percentile_interval(a[idx].mean(-1) - b[idx].mean(-1)) if idx is not None else nan,
        }
    return out


def verdict(differences: dict, ratios) -> dict:
    """The smallest ``R`` whose ``tail@R`` beats ``source`` and ``truncated@R`` (paired gap
    intervals above 0); ``pays_from`` None when none does (or when there are no intervals)."""
    measured = ", ".join(f"{r:g}" for r in sorted(ratios))
    undecided = False
    for r in sorted(ratios):
        a = differences[f"{point_name('tail', r)}_vs_source"]
        b = differences[f"{point_name('tail', r)}_vs_{point_name('truncated', r)}"]
        lows = (a["gap_diff_ci"][0], b["gap_diff_ci"][0])
        if any(lo is None or lo != lo for lo in lows):
            undecided = True
            continue
        if min(lows) > 0:
            return {
                "pays_from": float(r),
                "text": f"the transfer pays from R = {r:g}: tail@{r:g} - source {gap_diff_text(a)}, "
                f"tail@{r:g} - truncated@{r:g} {gap_diff_text(b)} (gap recovered, paired 95% intervals above 0)",
            }
    if undecided:
        return {"pays_from": None, "text": f"no verdict: no intervals (--bootstrap 0) at R = {measured}"}
    return {"pays_from": None, "text": f"does not pay at any measured point (R = {measured})"}


def run_frontier(run, mapping, samples, *, progress=None) -> dict:
    """Every condition of the frontier on the same samples; JSON-ready (see the module docstring).

    ``run``: a :class:`~kvbridge.run.Run` whose settings (an
    :class:`~kvbridge.evaluate.settings.EvalSettings`) give ``prefix_len``, ``continuation_len``,
    ``frontier_ratios``, ``sink``, ``batch_size``, ``attention``, ``bootstrap`` and ``seed``."""
    s = run.settings
    source, target, sink, bootstrap, seed = run.source.model, run.target.model, s.sink, s.bootstrap, s.seed
    pre = Prefills(source, target, mapping, host=run.host)
    samples, p, c = sample_ids(samples, s.prefix_len, s.continuation_len, RecomputeError)
    ratios = sorted({float(r) for r in s.frontier_ratios})
    if not ratios:
        raise RecomputeError("no frontier point to run", "pass --frontier R[,R...], e.g. 0.1,0.25,0.5")
    n = samples.shape[0]

    def point(kind, r, bt):
        rows = kept_rows(p, r, sink, tail=kind == "tail")
        if kind == "tail":
            st, cst = recompute_rows(target, pre.transferred(bt), rows, meta={"frontier": point_name(kind, r)})
        else:
            st, cst = truncated_state(target, pre.native(bt), rows)
        b = len(bt.index)  # truncated: the continuation keeps its own positions P..P+C-1
        kw = {"position_ids": torch.arange(p, p + c).expand(b, c)} if st.num_tokens != p else {}
        return Built(st, kwargs=kw, seconds=cst.seconds, flops=cst.flops, rows=int(rows.numel()))

    conds = pre.conditions("native", "source", "transferred")
    conds += [Condition(point_name(k, r), partial(point, k, r)) for r in ratios for k in ("truncated", "tail")]
    conds += pre.conditions("no_prefix")
    fields, cost = pre.run(conds, samples, p, c, s.batch_size, attention=s.attention, progress=progress)
    t = pre.timing
    t_native, t_source, t_transfer = t["target_prefill_s"], t["source_prefill_s"], t["transfer_s"]
    summary = summarize_fields(fields, bootstrap=bootstrap, seed=seed, reference="transferred")
    pairs = [("transferred", "source")]
    for r in ratios:
        tail, trunc = point_name("tail", r), point_name("truncated", r)
        pairs += [(tail, "source"), (tail, trunc), (trunc, "source")]
    diffs = paired_differences(fields, pairs, bootstrap=bootstrap, seed=seed)
    full = prefill_flops(target, p, batch=n)
    source_share = prefill_flops(source, p, batch=n) / full
    for cond, row in summary["conditions"].items():
        row["flop_share"] = 1.0 if cond == "native" else cost[cond]["flops"] / full
        row["source_flop_share"] = (
            source_share if cond in ("source", "transferred") or cond.startswith("tail@") else 0.0
        )
        row["total_flop_share"] = row["flop_share"] + row["source_flop_share"]
        row["time_share"] = cost[cond]["seconds"] / t_native if t_native > 0 and "@" in cond else None
        if "@" in cond:
            kind, r = cond.split("@")
            row["ratio"], row["rows_computed"] = float(r), cost[cond]["rows"]
            row["vs_source"] = diffs.get(f"{cond}_vs_source")
            if kind == "tail":
                row["vs_truncated"] = diffs[f"{cond}_vs_{point_name('truncated', float(r))}"]
        elif cond == "transferred":
            row["ratio"], row["rows_computed"], row["vs_source"] = 0.0, 0, diffs["transferred_vs_source"]
    result = {
        "schema": SCHEMA,
        "samples": n,
        "prefix_len": p,
        "continuation_len": c,
        "sink": int(sink),
        "ratios": ratios,
        "positions": "original",
        "bootstrap": bootstrap,
        "seed": seed,
        "conditions": summary["conditions"],
        "differences": diffs,
        "verdict": verdict(diffs, ratios),
        "timing": {
            "target_prefill_ms": 1e3 * t_native,
            "source_prefill_ms": 1e3 * t_source,
            "transfer_ms": 1e3 * t_transfer,
            "full_prefill_flops": full,
        },
        "notes": [
            f"truncated@R: the target's own prefill of the first {int(sink)} (sink) and the last ceil(R*P) prefix "
            "tokens only, at their original positions (the continuation stays at P..P+C-1); tail@R: the same rows "
            "computed by the target at every layer over the mapped cache of the others (tail@0: the plain transfer)",
            "flop_share: the target's FLOPs / its full prefill of the prefix (linear maps and attention, counted "
            "from the weights); source_flop_share: the source's prefill on the same scale (0 where no source runs)",
            "differences: gap recovered (and NLL) of x minus y on the same bootstrap resamples (paired), 95%",
        ],
    }
    return json_ready(result, stringify=False)
