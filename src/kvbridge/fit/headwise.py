"""``ridge-headwise``: one source KV head per target KV head, for small artifacts.

Each target (layer, head) reads exactly one source (layer, head): ``D_s`` features instead
of ``k·H_s·D_s``, so the artifact holds ``H_t·D_s·D_t`` numbers per target layer and K/V, and
far fewer observations determine the fit. The assignment: for every (source head, target
head) pair a single-head ridge is fitted on the training statistics, scored by its R² on the
held-out statistics (training statistics when there are none), averaged over K and V; each
target head takes the best source head (K and V from the same source head, as a head's keys
and values belong together). The final maps are the centred ridge of that pair, with
``alpha`` fixed or chosen per target head on the held-out split.

Statistics: only the per-source-head diagonal blocks of ``Cxx`` are kept (``p·D_s`` instead
of ``p²``); target layers are blocked to the memory budget as for ``ridge``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial

import torch

from kvbridge.fit.mapping import FittedMapping, LayerMap
from kvbridge.fit.protocol import FitReport
from kvbridge.fit.ridge import check_alpha
from kvbridge.fit.select import single_head_r2
from kvbridge.fit.stats import LayerStats
from kvbridge.fit.support import fit_head
from kvbridge.fit.solve import (
    DEFAULT_ALPHA,
    LOW_R2,
    check_determined,
    device_of,
    dims as dims_of,
    default_budget,
    plan_blocks,
    heldout_fields,
    require_calibration,
)


@dataclass(frozen=True)
class HeadwiseOptions:
    """Options of ``ridge-headwise`` (``-o key=value``)."""

    alpha: float | str = DEFAULT_ALPHA  # ridge strength, or "auto" (per target head, on the held-out split)
    memory_budget: int | None = None  # statistics bytes (None: 8 GiB or $KVBRIDGE_FIT_MEMORY)
    low_r2: float = LOW_R2  # warn below this mean held-out R²

    def __post_init__(self):
        check_alpha(self.alpha)


class HeadwiseFitter:
    """``ridge-headwise``: one source KV head per target KV head (assigned by R²)."""

    name = "ridge-headwise"
    Options = HeadwiseOptions

    def fit(self, source_spec, target_spec, calibration=None, options: HeadwiseOptions = HeadwiseOptions()):
        require_calibration(calibration, "ridge-headwise")
        dims = dims_of(source_spec, target_spec)
        ls, lt = source_spec.num_layers, target_spec.num_layers
        hs, ds, ht, dt = dims["src_heads"], dims["src_dim"], dims["tgt_heads"], dims["tgt_dim"]
        fix = "give more --tokens or a smaller --stride"
        check_determined(calibration.observations("train"), ds, what=f"one source head ({ds} dims)", fix=fix)
        budget = default_budget() if options.memory_budget is None else int(options.memory_budget)
        splits = 2 if calibration.observations("held") else 1  # no held-out split: its statistics stay empty
        blocks = plan_blocks(
            lt,
            lambda b: LayerStats.job_bytes_for(ls, len(b), **dims, xx_block="head", splits=splits),
            budget,
            what="the headwise fit",
        )
        layers, r2k, r2v, alphas, assign_all, score_all = ([None] * lt for _ in range(6))
        passes = []
        for bi, block in enumerate(blocks):
            job = LayerStats(range(ls), block, **dims, xx_block="head", device=device_of(calibration))
            tag = "headwise" if len(blocks) == 1 else f"headwise{bi}"
            calibration.accumulate([job], tag=tag)
            passes.append({"tag": tag, "bytes": job.nbytes(), "target_layers": list(block)})
            n_seen = job.n("train")
            check_determined(n_seen, ds, what=f"one source head ({ds} dims)", fix=fix)
            # scores[target layer in block, target head, source layer * H_s + source head]
            scores = single_head_r2(job, block)
            held_split, mean = scores["measured_on"], scores["mean"]
            best = mean.argmax(dim=2)
            held_ok = job.n("held") >= 1
            for j, t in enumerate(block):
                sources = tuple((int(i) // hs, int(i) % hs) for i in best[j])
                w = {c: torch.zeros(ht, ds, dt, dtype=torch.float64) for c in ("k", "v")}
                bias = {c: torch.zeros(ht, dt, dtype=torch.float64) for c in ("k", "v")}
                r2 = {c: torch.zeros(ht, dtype=torch.float64) for c in ("k", "v")}
                lam = []
                for h, src in enumerate(sources):
                    got = fit_head(
                        partial(job.moments, src_head=src, tgt_layers=[t], tgt_head=h), t, h, options.alpha, held_ok
                    )
                    for c, res in got.items():
                        w[c][h], bias[c][h], r2[c][h] = res["w"], res["b"], res["r2"]
                        lam.append(res["alpha"])
                layers[t] = LayerMap("headwise", sources, *(x[c].float() for c in "kv" for x in (w, bias)))
                r2k[t], r2v[t] = (r2["k"], r2["v"]) if held_ok else (None, None)
                alphas[t] = lam
                assign_all[t] = [list(s) for s in sources]
                score_all[t] = mean[j].tolist()
            del job
        report = FitReport(
            fitter=self.name,
            params={**asdict(options), "memory_budget": budget},
            layer_selection=assign_all,
            selection_scores={
                "mean": score_all,
                "measured_on": held_split,
                "layout": "[target layer][target head][source layer * source heads + source head]",
            },
            **heldout_fields(r2k, r2v, options.low_r2),
            alpha_chosen=alphas,
            observations={"train": int(n_seen), "features_per_head": ds},
            passes=passes,
        )
        return FittedMapping(source_spec, target_spec, layers, fitter=self.name, report=report)
