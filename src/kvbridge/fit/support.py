"""The ``ridge`` fitter's per-head path: ``support=head-local``, ``weighting=attention``, ``select=kl``.

(The options and what they mean: :mod:`kvbridge.fit.ridge`.) The steps:

1. the selection statistics of today's ridge (:meth:`RidgeFitter.accumulate`, the joint pass
   when it fits the budget), with the single-head R² table when a head-local support is wanted;
2. every candidate ``(support, k, alpha)`` gets, per target (layer, head), its ordered list of
   source ``(layer, head)`` slots: ``layers``: all heads of the top-k source layers of ``t``;
   ``head-local``: the k best source heads of ``(t, h)``;
3. the per-head statistics: from the joint statistics when they are unweighted and joint (no
   second pass), else a second pass (:class:`~kvbridge.fit.headstats.HeadStats`, weighted when
   ``weighting=attention``) over each head's union of candidate slots;
4. each candidate solved per head (:func:`kvbridge.fit.solve.fit_group`) and stored as a dense
   map over the union of its heads' source layers (zero rows for slots a head does not read);
5. ``select=kl``: the candidates scored by held-out suffix KL (:mod:`kvbridge.fit.select_kl`).
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from kvbridge.fit.headstats import HeadStats
from kvbridge.fit.mapping import FittedMapping, LayerMap
from kvbridge.fit.protocol import FitReport
from kvbridge.fit.select import top_k
from kvbridge.fit.select_kl import suffix_kl
from kvbridge.fit.solve import check_determined, device_of, dims, fit_group, heldout_fields

#: what a candidate ``(support, k, alpha)`` tuple holds, as the selection report names it
CANDIDATE = ("support", "top_k", "alpha")


def candidates(options, ks) -> list[tuple]:
    """``[(support, k, alpha)]`` to solve: the given settings (``select=r2``) or the grid ``select=kl`` searches."""
    if options.select == "r2":
        return [(options.support, k, options.alpha) for k in ks]
    k_grid = sorted({k for k in (1, 2, 4, 8) if k <= max(ks)} | set(ks))
    alphas = list(dict.fromkeys([options.alpha, "auto"]))
    return [(sup, k, a) for sup in ("layers", "head-local") for k in k_grid for a in alphas]


def slots_for(support: str, k: int, t: int, h: int, scores: dict, hs: int, src_layers) -> list:
    """Source ``(layer, head)`` slots target head ``(t, h)`` reads, best first."""
    if support == "layers":
        layers = top_k(scores["mean"][t : t + 1], src_layers, k)[0]
        return [(s, g) for s in layers for g in range(hs)]
    row = scores["head"][t, h]
    order = torch.argsort(row, descending=True, stable=True)[: min(k, row.numel())]
    src = list(src_layers)
    return [(src[int(i) // hs], int(i) % hs) for i in order]


def _moments(job, t: int, h: int, c: str, split: str, slots):
    """Moments of target head ``(t, h)`` over its ``slots`` from joint (full, all source layers)
    :class:`LayerStats` or from :class:`HeadStats` over each head's union of slots."""
    ds = job.src_dim
    if job.xx_block == "per-head":
        union = job.supports[(t, h)]
        rows = torch.cat([torch.arange(ds) + union.index(tuple(sl)) * ds for sl in slots])
        return job.stats[(t, h, c, split)].moments(rows=rows)
    fs, ft = job.src_heads * ds, job.tgt_heads * job.tgt_dim
    rows = torch.cat([torch.arange(ds) + job.src_layers.index(s) * fs + g * ds for s, g in slots])
    a = job.tgt_layers.index(t) * ft + h * job.tgt_dim
    return job.stats[(c, split)].moments(rows=rows, cols=slice(a, a + job.tgt_dim))


def fit_head(moments, t: int, h: int, alpha, held_ok: bool) -> dict:
    """``{"k" | "v": fit_group's result}`` of target head ``(t, h)`` from ``moments(kind, split)``, its
    ``r2`` one number (nan when unmeasured): the solve of every per-head fit."""
    out = {}
    for c in ("k", "v"):
        tr = moments(c, "train")
        he = moments(c, "held") if held_ok else None
        res = fit_group(tr, he, heads=1, alpha=alpha, what=f"target layer {t} head {h} {c.upper()}")
        out[c] = {**res, "r2": res["r2"][0] if res["r2"] is not None else float("nan")}
    return out


def fit_heads(fitter, source_spec, target_spec, calibration, options, ks) -> dict:
    """``{k: mapping}`` for the per-head settings (see the module docstring)."""
    d = dims(source_spec, target_spec)
    hs, ds, ht = d["src_heads"], d["src_dim"], d["tgt_heads"]
    ls, lt = source_spec.num_layers, target_spec.num_layers
    cands = candidates(options, ks)
    need_head = any(c[0] == "head-local" for c in cands)
    stats = fitter.accumulate(
        source_spec,
        target_spec,
        calibration,
        options,
        max_k=max((c[1] for c in cands if c[0] == "layers"), default=1),
        head_scores=need_head,
        select_only=True,
    )
    slots = {
        (sup, k): {(t, h): slots_for(sup, k, t, h, stats.scores, hs, range(ls)) for t in range(lt) for h in range(ht)}
        for sup, k in dict.fromkeys((c[0], c[1]) for c in cands)
    }
    n_train = calibration.observations("train")
    for (sup, k), per in slots.items():
        p = max(len(v) for v in per.values()) * ds
        check_determined(
            n_train,
            p,
            what=f"support={sup} top-k {k} ({p} features per target head)",
            fix="give more --tokens, a smaller --stride or --top-k",
        )
    joint = [j for j in stats.jobs if getattr(j, "xx_block", None) == "full" and len(j.src_layers) == ls]
    passes = list(stats.passes)
    if options.weighting == "uniform" and joint:
        job = joint[0]
    else:
        # each head's slots over every candidate, in first-seen order
        union = {key: list(dict.fromkeys(x for per in slots.values() for x in per[key])) for key in slots[cands[0][:2]]}
        p_max = max(len(v) for v in union.values()) * ds
        job = HeadStats(
            union,
            **d,
            weighted=options.weighting == "attention",
            ess_fraction=min(1.0, 2.0 * p_max / max(1.0, n_train)),
            device=device_of(calibration),
        )
        stats.jobs = []  # the selection statistics are no longer needed
        tag = "heads-weighted" if job.weighted else "heads"
        calibration.accumulate([job], tag=tag)
        passes.append({"tag": tag, "bytes": job.nbytes(), "weighted": job.weighted, "ess_fraction": job.ess_fraction})
    held_ok = job.n("held") >= 1
    solved = [
        _solve(fitter, job, cand, slots[cand[:2]], source_spec, target_spec, options, stats, passes, held_ok)
        for cand in cands
    ]
    if options.select == "r2":  # one candidate per k, in the order of ks
        return dict(zip(ks, solved))
    values = suffix_kl(
        calibration, solved, prefix_share=float(options.select_prefix), suffix=int(options.select_suffix)
    )
    out = {}
    for k in ks:
        pool = [i for i, c in enumerate(cands) if c[1] <= k] or list(range(len(cands)))
        best = min(pool, key=lambda i: (values[i], i))
        out[k] = solved[best]
        out[k].report.params["selection"] = {
            "criterion": "suffix_kl",
            "what": "mean KL(native || mapped) of the target's next-token distribution over the suffix, nats, "
            "on the calibration's held-out sequences",
            "prefix_share": float(options.select_prefix),
            "suffix_tokens": int(options.select_suffix),
            "chosen": dict(zip(CANDIDATE, cands[best])),
            "candidates": [
                {
                    **dict(zip(CANDIDATE, cands[i])),
                    "suffix_kl": values[i],
                    "heldout_r2": solved[i].report.r2_summary.get("mean"),
                }
                for i in pool
            ],
        }
    return out


def _solve(fitter, job, cand, per, source_spec, target_spec, options, stats, passes, held_ok):
    sup, k, alpha = cand
    hs, ds, ht, dt = job.src_heads, job.src_dim, job.tgt_heads, job.tgt_dim
    layers, r2s, alphas = [], [], []
    for t in range(target_spec.num_layers):
        union = sorted({s for h in range(ht) for s, _ in per[(t, h)]})
        w = {c: torch.zeros(len(union) * hs * ds, ht * dt, dtype=torch.float64) for c in ("k", "v")}
        b = {c: torch.zeros(ht * dt, dtype=torch.float64) for c in ("k", "v")}
        r2 = {c: torch.zeros(ht, dtype=torch.float64) for c in ("k", "v")}
        lam = {"k": [], "v": []}
        for h in range(ht):
            sl = per[(t, h)]
            rows = torch.cat([torch.arange(ds) + union.index(s) * hs * ds + g * ds for s, g in sl])
            cols = slice(h * dt, (h + 1) * dt)
            got = fit_head(lambda c, split, t=t, h=h, sl=sl: _moments(job, t, h, c, split, sl), t, h, alpha, held_ok)
            for c, res in got.items():
                w[c][rows, cols], b[c][cols], r2[c][h] = res["w"], res["b"], res["r2"]
                lam[c].append(res["alpha"])
        layers.append(LayerMap("dense", tuple(union), *(x[c].float() for c in "kv" for x in (w, b))))
        r2s.append(r2)
        alphas.append([lam["k"], lam["v"]])
    params = {**asdict(options), "support": sup, "top_k": k, "alpha": alpha, "memory_budget": stats.budget}
    # [target layer][target head] -> [[source layer, source head], ...]
    params["head_support"] = [[[list(x) for x in per[(t, h)]] for h in range(ht)] for t in range(len(layers))]
    report = FitReport(
        fitter=fitter.name,
        params=params,
        layer_selection=[list(lm.sources) for lm in layers],
        selection_scores={
            "mean": stats.scores["mean"].tolist(),
            "measured_on": stats.scores["measured_on"],
            **({"head": stats.scores["head"].tolist()} if "head" in stats.scores else {}),
        },
        **heldout_fields([r["k"] for r in r2s], [r["v"] for r in r2s], options.low_r2, measured=held_ok),
        alpha_chosen=alphas,
        observations={"train": int(job.n("train")), "features_per_head": max(len(v) for v in per.values()) * ds},
        passes=passes,
    )
    return FittedMapping(source_spec, target_spec, layers, fitter=fitter.name, report=report)
