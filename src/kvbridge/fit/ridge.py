"""The ``ridge`` fitter: centred affine ridge per target (layer, KV head) on the top-k source layers.

The solver and its algebra live in :mod:`kvbridge.fit.solve`; the selection in
:mod:`kvbridge.fit.select`.

**Memory model** (the ``ridge`` fitter). One accumulation job over source layers ``U`` and
target layers ``B`` holds, for K and V and for the train and held-out splits, ``8 bytes ×
(p² + p·q + 2p + 2q)`` with ``p = |U|·H_s·D_s`` and ``q = |B|·H_t·D_t``; nothing grows with the
number of tokens. When the joint job (all source layers × all target layers) fits in
``memory_budget`` (default 8 GiB, ``$KVBRIDGE_FIT_MEMORY`` in GiB) one pass over the corpus
gives both the layer selection and the final fit. Otherwise the fit takes more passes:
selection passes keep only the per-source-layer diagonal blocks of ``Cxx`` (``p·H_s·D_s``) for
as many target layers as fit, then fit passes accumulate the joint statistics of each block
of target layers over the union of the source layers they selected, the blocks sized to the
budget. Each pass re-runs both models over the corpus: memory is traded for forward passes.

``alpha="auto"`` picks λ per (target layer, K/V) on the held-out statistics from
:func:`alpha_grid`: 0.01 and ``s · 10^e`` for ``e`` in -6..1, ``s`` the mean diagonal of
``Cxx`` (so the grid follows the features' scale).

**Support** (``-o support=``). ``layers`` (the default): every KV head of the top-k source
layers (ranked per target layer by single-layer R²) feeds every head of the target layer,
``k·H_s·D_s`` features. ``head-local``: target head ``(t, h)`` reads only its own top-k source
KV heads, ranked for that head by the held-out R² of a single-head ridge
(:func:`kvbridge.fit.select.single_head_r2`, the assignment ``ridge-headwise`` makes; with
``top_k=1`` it is exactly that assignment, CacheBridge's "matching head"), ``k·D_s``
features. The matching is by R², not by index or relative depth: index matching is
meaningless when the two models' head counts differ, and R² is measured on held-out text.
The head-local map is stored in the ``dense`` layout over the union of its heads' source
layers, with zero rows for the slots a head does not read.

**Weights** (``-o weighting=``). ``uniform``: every observation counts once. ``attention``:
each observation of target head ``(t, h)`` is weighted by how much later target queries read
that position (:mod:`kvbridge.fit.repair`: CacheBridge's attention repair, r_V and r_K at ~32
log-spaced query boundaries per sequence, shrunk toward uniform so ``ESS >= min(n, 2p)``). The
weights differ per target head, so the weighted co-moments are per head
(:class:`~kvbridge.fit.headstats.HeadStats`): a second pass over the corpus, after the selection
pass fixed each head's support. Held-out statistics stay unweighted, so held-out R² compares
across weightings.

**Statistics GEMMs** (``-o gram_dtype=``). ``float32`` (default): the full co-moments are
accumulated from float32 products of row chunks centred on their float64 mean, added into
float64 statistics (only the upper half of ``XcᵀXc`` multiplied); the means, Chan's merge and
every solve stay float64 (issue 35: ~1e-6 relative on the weights). ``float64``: every product
in float64.

**Selection** (``-o select=``). ``r2``: top-k, alpha and support as given. ``kl``: every ``k``
of the sweep up to ``top_k``, alpha in (the given alpha, ``auto``) and support in (``layers``,
``head-local``) is solved from the same statistics and scored by the mean KL divergence of the
target's next-token distribution over a suffix when it continues from the mapped cache of the
prefix vs from its own cache, on the calibration's held-out sequences
(:func:`kvbridge.fit.select_kl.suffix_kl`); the best one is returned and the manifest records
the criterion and every candidate's value (``selection.candidates``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from kvbridge.fit.settings import DEFAULT_TOP_K
from kvbridge.fit.mapping import FittedMapping, LayerMap
from kvbridge.fit.protocol import FitReport
from kvbridge.fit.plan import DEFAULT_GRAM_DTYPE, GRAM_DTYPES, check_choice
from kvbridge.fit.stats import LayerStats
from kvbridge.fit.support import fit_heads
from kvbridge.fit.solve import (  # noqa: F401  (re-exported: the solver's historical home)
    DEFAULT_ALPHA,
    LOW_R2,
    FitError,
    alpha_grid,
    check_determined,
    default_budget,
    device_of,
    dims,
    fit_group,
    grouped_r2,
    heldout_fields,
    plan_blocks,
    r2_summary,
    require_calibration,
    scores_record,
    solve,
    sse,
)


def check_alpha(alpha) -> None:
    if alpha != "auto" and (isinstance(alpha, str) or not (float(alpha) >= 0 and math.isfinite(float(alpha)))):
        raise FitError(f"--alpha must be a non-negative number or 'auto', got {alpha!r}", "use e.g. --alpha 0.01")


def check_top_k(top_k) -> None:
    if int(top_k) < 1:
        raise FitError(f"--top-k must be >= 1, got {top_k}", "use e.g. --top-k 4")


SUPPORTS = ("layers", "head-local")
WEIGHTINGS = ("uniform", "attention")
SELECTS = ("r2", "kl")


@dataclass(frozen=True)
class RidgeOptions:
    """Options of ``ridge`` (``-o key=value``)."""

    top_k: int = DEFAULT_TOP_K  # source layers per target layer (what `kvbridge check` assumes too)
    alpha: float | str = DEFAULT_ALPHA  # ridge strength, or "auto" (chosen on the held-out split)
    memory_budget: int | None = None  # statistics bytes (None: 8 GiB or $KVBRIDGE_FIT_MEMORY)
    low_r2: float = LOW_R2  # warn below this mean held-out R²
    #: "layers": all heads of the top-k source layers; "head-local": each head's top-k source heads
    support: str = "layers"
    weighting: str = "uniform"  # "uniform", or "attention": attention-repair observation weights (a second pass)
    select: str = "r2"  # "r2": top_k/alpha/support as given; "kl": chosen by held-out suffix KL to native
    select_prefix: float = 0.5  # select=kl: share of each held-out sequence used as the mapped prefix
    select_suffix: int = 32  # select=kl: suffix tokens scored after the prefix
    #: the statistics GEMMs' dtype: "float32" (chunks centred on their float64 mean, products added into
    #: the float64 statistics; solves stay float64) or "float64" (every product in float64)
    gram_dtype: str = DEFAULT_GRAM_DTYPE

    def __post_init__(self):
        check_top_k(self.top_k)
        check_alpha(self.alpha)
        for name, choices in (
            ("support", SUPPORTS),
            ("weighting", WEIGHTINGS),
            ("select", SELECTS),
            ("gram_dtype", GRAM_DTYPES),
        ):
            check_choice(name, getattr(self, name), choices, FitError)
        if not 0.0 < float(self.select_prefix) < 1.0:
            raise FitError(f"-o select_prefix must be in (0, 1), got {self.select_prefix}", "use e.g. 0.5")
        if int(self.select_suffix) < 1:
            raise FitError(f"-o select_suffix must be >= 1, got {self.select_suffix}", "use e.g. 32")

    @property
    def plain(self) -> bool:
        """Today's ridge: layer support, uniform weights, selection by R²."""
        return self.support == "layers" and self.weighting == "uniform" and self.select == "r2"


@dataclass
class RidgeStatistics:
    """What a ridge fit accumulated: selection scores ``[T, S]`` and the joint statistics of
    blocks of target layers (``jobs``, one :class:`~kvbridge.fit.stats.LayerStats` each, over
    the source layers any ``top_k <= max_k`` selects); saved by ``--keep-stats``
    (:mod:`kvbridge.fit.keep`) and solved again without the models."""

    source_spec: object
    target_spec: object
    scores: dict  # "mean", "k", "v": [T, S] float64 tensors; "measured_on": "held" or "train"
    jobs: list
    max_k: int
    passes: list = field(default_factory=list)
    budget: int = 0
    n_train: float = 0.0
    job_loader: object = None  # kept statistics on disk: a callable yielding the jobs one at a time

    def iter_jobs(self):
        yield from self.job_loader() if self.job_loader is not None else self.jobs


class _BlockSolver:
    """Solves each block of joint statistics for every k as it comes, then assembles the mappings."""

    def __init__(self, fitter, source_spec, target_spec, options, ks):
        self.fitter, self.source_spec, self.target_spec = fitter, source_spec, target_spec
        self.options, self.ks = options, ks
        self.dims = dims(source_spec, target_spec)
        self.results = {k: {} for k in ks}
        self.selection: dict = {}

    def add(self, job, scores) -> None:
        from kvbridge.fit.select import top_k as pick

        for k in self.ks:
            if k not in self.selection:
                self.selection[k] = pick(scores["mean"], range(self.source_spec.num_layers), k)
            self.results[k].update(
                self.fitter._solve_layers(job, job.tgt_layers, self.selection[k], self.options.alpha, self.dims)
            )

    def mappings(self, stats) -> dict:
        return {k: self._mapping(stats, k) for k in self.ks}

    def _mapping(self, stats, k):
        scores, results, selection = stats.scores, self.results[k], self.selection[k]
        fs = self.dims["src_heads"] * self.dims["src_dim"]
        res = [results[t] for t in range(self.target_spec.num_layers)]  # per target layer: K and V fits
        layers = [
            LayerMap("dense", tuple(selection[t]), *(r[c][x].float() for c in "kv" for x in "wb"))
            for t, r in enumerate(res)
        ]
        r2k, r2v = ([r[c]["r2"] for r in res] for c in "kv")
        report = FitReport(
            fitter=self.fitter.name,
            params={**asdict(self.options), "top_k": k, "memory_budget": stats.budget},
            layer_selection=[list(s) for s in selection],
            selection_scores=scores_record(scores),
            **heldout_fields(r2k, r2v, self.options.low_r2),
            alpha_chosen=[[r["k"]["alpha"], r["v"]["alpha"]] for r in res],
            observations={"train": int(stats.n_train), "features_per_head": k * fs},
            passes=stats.passes,
        )
        return FittedMapping(self.source_spec, self.target_spec, layers, fitter=self.fitter.name, report=report)


class RidgeFitter:
    """``ridge``: centred affine ridge per target (layer, KV head) on the top-k source layers."""

    name = "ridge"
    Options = RidgeOptions

    def fit(self, source_spec, target_spec, calibration=None, options: RidgeOptions = RidgeOptions()):
        k = min(int(options.top_k), source_spec.num_layers)
        return self.fit_sweep(source_spec, target_spec, calibration, options, [k])[k]

    def fit_sweep(self, source_spec, target_spec, calibration, options: RidgeOptions, ks, *, keep=None) -> dict:
        """``{k: mapping}`` for every ``k`` in ``ks`` from ONE accumulation (the passes of the largest k).

        Each block of joint statistics is solved for every k as soon as it is complete and then
        dropped (``keep``: a :class:`kvbridge.fit.keep.StatsWriter` that saves it first), so the
        memory of a sweep is the memory of one fit.
        """
        require_calibration(calibration, "ridge")
        ks = list(dict.fromkeys(min(int(k), source_spec.num_layers) for k in ks))
        if not options.plain:  # head-local support, attention weights or selection by KL: the per-head path
            if keep is not None:
                raise FitError(
                    "--keep-stats keeps the joint statistics of -o support=layers weighting=uniform select=r2 only",
                    "drop --keep-stats, or keep them with the default options and solve those with --from-stats",
                )
            return fit_heads(self, source_spec, target_spec, calibration, options, ks)
        solver = _BlockSolver(self, source_spec, target_spec, options, ks)

        def on_block(job, scores):
            if keep is not None:
                keep.add(job)
            solver.add(job, scores)

        stats = self.accumulate(source_spec, target_spec, calibration, options, max_k=max(ks), on_block=on_block)
        if keep is not None:
            keep.finish(stats)
        return solver.mappings(stats)

    def solve(self, stats: "RidgeStatistics", options: RidgeOptions, ks=None) -> dict:
        """``{k: mapping}`` from kept statistics (``ks``: default ``[options.top_k]``), one block at a time."""
        if not options.plain:
            raise FitError(
                "kept statistics solve -o support=layers weighting=uniform select=r2 only (the per-head options "
                "need the models: a weighted or per-head pass, or the target's KL)",
                "refit from the models with those options",
            )
        ks = list(dict.fromkeys(min(int(k), stats.source_spec.num_layers) for k in (ks or [options.top_k])))
        over = [k for k in ks if k > stats.max_k]
        if over:
            raise FitError(
                f"--top-k {over[0]} needs statistics accumulated for top-k {over[0]} or more; these were "
                f"kept for top-k {stats.max_k}",
                f"use --top-k {stats.max_k} or less, or refit from the models",
            )
        self._check_seen(stats.n_train, max(ks), dims(stats.source_spec, stats.target_spec))
        solver = _BlockSolver(self, stats.source_spec, stats.target_spec, options, ks)
        for job in stats.iter_jobs():
            solver.add(job, stats.scores)
        return solver.mappings(stats)

    def accumulate(
        self,
        source_spec,
        target_spec,
        calibration,
        options: RidgeOptions,
        *,
        max_k: int,
        on_block=None,
        head_scores: bool = False,
        select_only: bool = False,
    ):
        """The :class:`RidgeStatistics` any ``top_k <= max_k`` (and any alpha) is solved from.

        One joint pass when the job fits the budget, else selection passes then fit passes over
        blocks of target layers (the union of each block's top-``max_k`` source layers; the
        top-k lists are nested, so every smaller k is covered by the same statistics).
        ``on_block(job, scores)`` is called with each complete block, which is then dropped
        (held only when there is no ``on_block``). ``head_scores``: also ``scores["head"]``
        ``[T, H_t, S·H_s]``, the single-head R² table (:func:`~kvbridge.fit.select.single_head_r2`);
        ``select_only``: the blocked path stops after the selection passes (the per-head path
        accumulates its own statistics).
        """
        # imported per call: bench_fit_speed swaps select's functions
        from kvbridge.fit.select import single_head_r2, single_layer_r2, top_k as pick

        dims_ = dims(source_spec, target_spec)
        splits = 2 if calibration.observations("held") else 1  # no held-out split: its statistics stay empty
        ls, lt = source_spec.num_layers, target_spec.num_layers
        k = min(int(max_k), ls)
        fs = dims_["src_heads"] * dims_["src_dim"]
        self._check_seen(
            calibration.observations("train"),
            k,
            dims_,
            fix=f"give at least {k * fs} training observations (more --tokens, or a smaller --stride), "
            f"a smaller --top-k, or --fitter ridge-headwise ({dims_['src_dim']} features per head)",
        )
        budget = default_budget() if options.memory_budget is None else int(options.memory_budget)
        gram = options.gram_dtype
        passes, jobs = [], []
        emit = on_block or (lambda job, scores: jobs.append(job))  # each complete block: passed on, or kept

        def run(tag: str, src_layers, block, xx_block: str):  # one pass over the corpus: one job's statistics
            job = LayerStats(
                src_layers, block, **dims_, xx_block=xx_block, device=device_of(calibration), gram_dtype=gram
            )
            calibration.accumulate([job], tag=tag)
            passes.append(
                {"tag": tag, "bytes": job.nbytes(), **({} if tag == "joint" else {"target_layers": list(block)})}
            )
            return job

        def selection_scores(job, block) -> dict:
            sc = single_layer_r2(job)
            if head_scores:
                sc["head"] = single_head_r2(job, block)["mean"]
            return sc

        # one pass (selection + fit) when the joint job fits the budget
        if LayerStats.job_bytes_for(ls, lt, **dims_, xx_block="full", gram_dtype=gram, splits=splits) <= budget:
            job = run("joint", range(ls), range(lt), "full")
            scores = selection_scores(job, range(lt))
            n_seen = job.n("train")
            self._check_seen(n_seen, k, dims_)
            emit(job, scores)
            del job
        else:  # blocked: selection passes, then fit passes over blocks of target layers
            sel_blocks = plan_blocks(
                lt,
                lambda b: LayerStats.job_bytes_for(ls, len(b), **dims_, xx_block="layer", splits=splits),
                budget,
                what="layer selection",
            )
            parts = []  # each block's scores, rows = its target layers (the blocks are consecutive)
            for bi, block in enumerate(sel_blocks):
                job = run(f"select{bi}", range(ls), block, "layer")
                parts.append(selection_scores(job, block))
                n_seen = job.n("train")
                del job
            self._check_seen(n_seen, k, dims_)
            scores = {key: torch.cat([sc[key] for sc in parts]) for key in parts[0] if key != "measured_on"}
            scores["measured_on"] = parts[-1]["measured_on"]
            selection = pick(scores["mean"], range(ls), k)
            if select_only:
                return RidgeStatistics(source_spec, target_spec, scores, jobs, k, passes, budget, float(n_seen))

            def union(b):
                return sorted({s for t in b for s in selection[t]})

            fit_blocks = plan_blocks(
                lt,
                lambda b: LayerStats.job_bytes_for(len(union(b)), len(b), **dims_, gram_dtype=gram, splits=splits),
                budget,
                what="the joint fit",
            )
            for bi, block in enumerate(fit_blocks):
                emit(run(f"fit{bi}", union(block), block, "full"), scores)
        return RidgeStatistics(source_spec, target_spec, scores, jobs, k, passes, budget, float(n_seen))

    @staticmethod
    def _check_seen(
        n_seen, k, dims_, fix="give more --tokens, a smaller --stride or --top-k, or --fitter ridge-headwise"
    ) -> None:
        hs, ds = dims_["src_heads"], dims_["src_dim"]
        check_determined(n_seen, k * hs * ds, what=f"top-k {k} source layers x {hs} KV heads x {ds} dims", fix=fix)

    @staticmethod
    def _solve_layers(job, block, selection, alpha, dims_) -> dict:
        out = {}
        held_ok = job.n("held") >= 1
        for t in block:
            res = {}
            for kind in ("k", "v"):
                train = job.moments(kind, "train", src_layers=selection[t], tgt_layers=[t])
                held = job.moments(kind, "held", src_layers=selection[t], tgt_layers=[t]) if held_ok else None
                res[kind] = fit_group(
                    train, held, heads=dims_["tgt_heads"], alpha=alpha, what=f"target layer {t} {kind.upper()}"
                )
            out[t] = res
        return out


__all__ = [
    "RidgeFitter",
    "RidgeOptions",
    "RidgeStatistics",
    "check_alpha",
    "check_top_k",
    "r2_summary",
    "plan_blocks",
    "default_budget",
    "LOW_R2",
    "solve",
    "sse",
    "grouped_r2",
    "alpha_grid",
    "fit_group",
    "check_determined",
    "FitError",
    "DEFAULT_ALPHA",
]
