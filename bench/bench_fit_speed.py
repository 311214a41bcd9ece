"""Issue 35: where ``RidgeFitter().fit``'s time goes at bench_peer's fit sizes, and candidate
speed-ups of its two hot steps, timed AND checked for accuracy against today's float64 path.

The data and the fit are exactly ``bench/bench_peer.py``'s "ours" side (``fit_batches``: the
planted synthetic observations of geometry 24x2x64 -> 28x2x128 in 2,048-token batches; ridge,
alpha 0.01, top-k 4, no held-out split). kvbridge is imported read-only; the candidates are
monkeypatches installed for one fit and removed after it:

- ``base``: the library as it is (since session 11: float32 symmetric Gram on 1,024-row chunks,
  the closed-form training R² in the selection; selection solves one source layer at a time, the
  final fit one (target layer, K/V) at a time);
- ``f64``: the library with ``-o gram_dtype=float64`` (every statistics product in float64: the
  arithmetic before session 11; ``--reference f64`` measures the float32 Gram's error against it);
- ``f32gram``: the batch in chunks of up to 2,048 rows, each centred on its float64 mean, the
  Gram GEMMs ``XcᵀXc`` and ``XcᵀYc`` in float32, each chunk's product added into the float64
  statistics (the Chan merge, the means and ``cyy`` stay float64);
- ``f32sym``: ``f32gram`` multiplying only the upper block-triangle of ``XcᵀXc`` (strips of
  512 columns; the transpose of each strip added below the diagonal);
- ``trainr2``: the selection's R² on training statistics (no held-out split, as here) from
  ``cyy - Σ W⊙Cxy - λ Σ W²`` instead of a second ``Cxx W`` GEMM per source layer;
- ``batched``: the selection's 24 single-layer ridges of one K/V as ONE batched Cholesky and
  solve over ``[S, 128, 128]`` (and its R² batched), the final fit's 28 target layers x K/V as
  ONE batched Cholesky + ``cholesky_solve`` over ``[2T, 512, 512]``.

Candidates join parts with ``+`` (``f32sym+trainr2``). ``--spread D`` rescales the source
features' dims by ``10^linspace(-D/2, D/2)`` and ``--offset O`` adds ``O`` to them (an
ill-conditioned, off-centre Gram: what float32 must survive on real K/V).

``--parts profile`` wraps the hot functions with wall-clock timers (one fit, base code; the first
fit of the process, so first-touch costs are in it: the statistics' zero-fill, the cxx mirror, the
gathers, the selection's and the final fit's solves, the mapping's assembly, each when the library
has it) and prints the shapes and counts of what runs. ``--parts gemm``: float64 ``addmm_`` vs float32 GEMM (+ its
add into float64) throughput at the accumulation's shapes. ``--parts eig``: the cost of ``alpha=auto`` (one
Cholesky per grid alpha vs one eigendecomposition reused for every alpha) on one final-fit
system. Accuracy: max relative difference (``max|a - a_ref| / max|a_ref|``) of the fitted
weights and biases and of the mapped K/V of the first 256 observations against the
``--reference`` candidate (default ``base``), whether the layer selection is identical, and
``identical`` (weights, biases and scores bitwise equal). ``--save PATH`` writes the first
candidate's mapping; ``--against PATH`` compares every candidate with one saved by another tree
(e.g. ``PYTHONPATH=/work/main/src ... --save old.safetensors``, then this tree ``--against`` it). Run alone (``/work/wt/quiet``):

    PYTHONPATH=src python bench/bench_fit_speed.py --obs 1024 --threads 1,2 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_peer import ALPHA, GEOMETRY, TOP_K, Ours, fit_batches, parse_geometry  # noqa: E402

F64 = torch.float64


# -- the candidates -------------------------------------------------------------------------------------------------
F32_ROWS = 2048  # rows per float32 chunk (the float64 merge costs p² + pq per chunk: fewer, larger chunks)


def _f32_chunk(self, x, y, sym: bool) -> None:
    """One chunk: centred on its float64 mean, Gram GEMMs in float32, added into the float64
    statistics with Chan's merge. ``sym``: only the upper block-triangle of ``XcᵀXc`` is
    multiplied (column strips of 512), its transpose added below the diagonal."""
    m = int(x.shape[0])
    mx, my = x.mean(0, dtype=F64), y.mean(0, dtype=F64)
    xc = x.to(torch.float32, copy=True).sub_(mx.float())
    yc = y.to(torch.float32, copy=True).sub_(my.float())
    n = self.n + m
    w = self.n * m / n
    dx, dy = mx - self.mean_x, my - self.mean_y
    cxx = self.cxx  # (a property since session 11: the library's own float32 path mirrors on read)
    if sym:
        p, step = self.p, 512
        for i in range(0, p, step):
            e = min(p, i + step)
            blk = xc[:, i:e].T @ xc[:, i:]  # [e - i, p - i]
            cxx[i:e, i:] += blk
            if e < p:
                cxx[e:, i:e] += blk[:, e - i :].T
    else:
        cxx += xc.T @ xc
    cxx.addr_(dx, dx, alpha=w)
    self.cxy += xc.T @ yc
    self.cxy.addr_(dx, dy, alpha=w)
    self.cyy += yc.square().sum(0, dtype=F64)
    self.cyy += w * dy * dy
    self.mean_x += dx * (m / n)
    self.mean_y += dy * (m / n)
    self.n = n


def _f32_update(sym: bool):
    def update(self, x, y, rows=None, weights=None):
        """``MomentStats.update`` taking the batch in float32 chunks of up to F32_ROWS rows."""
        if weights is not None or rows is not None or self.xx_block is not None:
            return ORIGINAL["update"](self, x, y, rows=rows, weights=weights)
        for a in range(0, int(x.shape[0]), F32_ROWS):
            _f32_chunk(self, x[a : a + F32_ROWS], y[a : a + F32_ROWS], sym)
        return self

    return update


def train_single_layer_r2(job, *, alpha=0.01, tgt_layers=None):
    """``select.single_layer_r2`` when R² is measured on the training statistics (no held-out
    split): at ``W = (Cxx + λI)⁻¹Cxy`` the training SSE per output dim is
    ``cyy - Σ W⊙Cxy - λ Σ W²`` (and the mean residual is 0), so the second GEMM ``Cxx W`` goes."""
    from kvbridge.fit.solve import solve

    if job.n("held") >= 1:
        return ORIGINAL["single_layer_r2"](job, alpha=alpha, tgt_layers=tgt_layers)
    tgt = list(job.tgt_layers if tgt_layers is None else tgt_layers)
    lam = alpha if isinstance(alpha, (int, float)) else 0.01
    groups = len(tgt) * job.tgt_heads
    out = {}
    for kind in ("k", "v"):
        cols = []
        for s in job.src_layers:
            m = job.moments(kind, "train", tgt_layers=tgt, src_layers=[s])
            w, _ = solve(m, lam)
            e = (m.cyy - (w * m.cxy).sum(0) - lam * (w * w).sum(0)).clamp(min=0.0)
            e = e.reshape(groups, -1).sum(1)
            t = m.cyy.reshape(groups, -1).sum(1)
            r2 = torch.where(t > 0, 1.0 - e / t.clamp(min=1e-300), torch.zeros_like(t))
            cols.append(r2.view(len(tgt), job.tgt_heads).mean(1))
        out[kind] = torch.stack(cols, -1).to(F64)
    out["mean"] = (out["k"] + out["v"]) / 2
    out["measured_on"] = "train"
    return out


def _batched_solve(a, cxy, alpha):
    """``W [B, p, q]`` of ``(A + αI) W = Cxy`` per batch entry (Cholesky; lstsq where not SPD)."""
    a = a.to(F64, copy=True)
    a.diagonal(dim1=-2, dim2=-1).add_(float(alpha))
    chol, info = torch.linalg.cholesky_ex(a)
    if bool((info != 0).any()):
        return torch.linalg.lstsq(a, cxy).solution
    if cxy.shape[-1] >= a.shape[-1]:
        return torch.cholesky_inverse(chol) @ cxy
    return torch.cholesky_solve(cxy, chol)


def batched_single_layer_r2(job, *, alpha=0.01, tgt_layers=None):
    """``select.single_layer_r2`` with the source layers as one batch (joint ``full`` jobs only)."""
    from kvbridge.fit.stats import LayerStats  # noqa: F401

    tgt = list(job.tgt_layers if tgt_layers is None else tgt_layers)
    st = job.stats[("k", "train")]
    if tgt_layers is not None or st.xx_block is not None:
        return ORIGINAL["single_layer_r2"](job, alpha=alpha, tgt_layers=tgt_layers)
    lam = alpha if isinstance(alpha, (int, float)) else 0.01
    held_split = "held" if job.n("held") >= 1 else "train"
    s, fs, ht = len(job.src_layers), job.src_heads * job.src_dim, job.tgt_heads
    out = {}
    for kind in ("k", "v"):
        tr, he = job.stats[(kind, "train")], job.stats[(kind, held_split)]

        def blocks(ms):
            q = ms.q
            cxx = ms.cxx.view(s, fs, s, fs).diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # [S, fs, fs]
            return cxx, ms.cxy.view(s, fs, q), ms.mean_x.view(s, fs), ms.mean_y, ms.cyy, ms.n

        cxx, cxy, mx, my, _, _ = blocks(tr)
        w = _batched_solve(cxx, cxy, lam)  # [S, fs, q]
        b = my - torch.einsum("sp,spq->sq", mx, w)
        hxx, hxy, hmx, hmy, hyy, hn = blocks(he)
        quad = (w * (hxx @ w)).sum(1)
        cross = (w * hxy).sum(1)
        resid = hmy - torch.einsum("sp,spq->sq", hmx, w) - b
        e = (hyy - 2.0 * cross + quad + hn * resid * resid).clamp(min=0.0)  # [S, q]
        e = e.view(s, len(tgt), ht, -1).sum(-1)
        t = hyy.view(len(tgt), ht, -1).sum(-1)
        r2 = torch.where(t > 0, 1.0 - e / t.clamp(min=1e-300), torch.zeros_like(t))  # [S, T, H]
        out[kind] = r2.mean(-1).T.contiguous().to(F64)  # [T, S]
    out["mean"] = (out["k"] + out["v"]) / 2
    out["measured_on"] = held_split
    return out


def batched_solve_layers(job, block, selection, alpha, dims_):
    """``RidgeFitter._solve_layers`` with every (target layer, K/V) of the block as one batch."""
    from kvbridge.fit.solve import grouped_r2
    from kvbridge.fit.stats import Moments

    if alpha == "auto":
        return ORIGINAL["solve_layers"](job, block, selection, alpha, dims_)
    held_ok = job.n("held") >= 1
    block = list(block)
    mom = [
        (t, kind, job.moments(kind, "train", src_layers=selection[t], tgt_layers=[t]))
        for t in block
        for kind in ("k", "v")
    ]
    ps = {m.p for _, _, m in mom}
    if len(ps) != 1:
        return ORIGINAL["solve_layers"](job, block, selection, alpha, dims_)
    a = torch.stack([m.cxx for _, _, m in mom])
    cxy = torch.stack([m.cxy.to(F64) for _, _, m in mom])
    w = _batched_solve(a, cxy, float(alpha))
    out = {t: {} for t in block}
    for i, (t, kind, m) in enumerate(mom):
        wi = w[i]
        bi = m.mean_y - m.mean_x @ wi
        r2 = None
        if held_ok:
            held = job.moments(kind, "held", src_layers=selection[t], tgt_layers=[t])
            r2 = grouped_r2(wi, bi, held, dims_["tgt_heads"])
        out[t][kind] = {"w": wi, "b": bi, "alpha": float(alpha), "r2": r2}
    _ = Moments
    return out


ORIGINAL: dict = {}


@contextlib.contextmanager
def patched(name: str):
    import kvbridge.fit.select as sel
    import kvbridge.fit.stats as stats_mod
    from kvbridge.fit.ridge import RidgeFitter
    from kvbridge.fit.stats import MomentStats

    ORIGINAL.setdefault("update", MomentStats.update)
    ORIGINAL.setdefault("chunk_rows", stats_mod.chunk_rows)
    ORIGINAL.setdefault("single_layer_r2", sel.single_layer_r2)
    ORIGINAL.setdefault("solve_layers", RidgeFitter.__dict__["_solve_layers"].__func__)
    ORIGINAL.setdefault("options", RidgeFitter.Options)
    try:
        parts = set(name.split("+"))
        if "f64" in parts:  # the library's float64 path: bench_peer's Ours builds RidgeFitter.Options(top_k, alpha)
            opts = ORIGINAL["options"]
            RidgeFitter.Options = lambda **kw: opts(**{"gram_dtype": "float64", **kw})
        if parts & {"f32gram", "f32sym"}:  # LayerStats.update hands the batch over in F32_ROWS chunks
            stats_mod.chunk_rows = lambda p, q, budget=None, gram_dtype=None: F32_ROWS
        if "f32gram" in parts:
            MomentStats.update = _f32_update(sym=False)
        if "f32sym" in parts:
            MomentStats.update = _f32_update(sym=True)
        if "trainr2" in parts:
            sel.single_layer_r2 = train_single_layer_r2
        if "batched" in parts:
            sel.single_layer_r2 = batched_single_layer_r2
            RidgeFitter._solve_layers = staticmethod(batched_solve_layers)
        yield
    finally:
        MomentStats.update = ORIGINAL["update"]
        stats_mod.chunk_rows = ORIGINAL["chunk_rows"]
        sel.single_layer_r2 = ORIGINAL["single_layer_r2"]
        RidgeFitter._solve_layers = staticmethod(ORIGINAL["solve_layers"])
        RidgeFitter.Options = ORIGINAL["options"]


PARTS = ("base", "f64", "f32gram", "f32sym", "trainr2", "batched")
DEFAULT_CANDIDATES = "base,f32gram,f32sym,trainr2,f32sym+trainr2"


# -- the profile ----------------------------------------------------------------------------------------------------
def profile(side, batches, n) -> dict:
    """One base fit with wall-clock timers around the hot functions; shapes and call counts (a
    function the library does not have is skipped; nested timers overlap: "total" rows include
    the steps listed under them)."""
    import kvbridge.fit.ridge as ridge_mod
    import kvbridge.fit.select as sel
    import kvbridge.fit.solve as solve_mod
    from kvbridge.fit.stats import LayerStats, MomentStats

    secs, calls, shapes = defaultdict(float), defaultdict(int), defaultdict(set)

    def wrap(label, fn, shape_of=None):
        def inner(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                secs[label] += time.perf_counter() - t0
                calls[label] += 1
                if shape_of is not None:
                    shapes[label].add(shape_of(*a, **k))

        return inner

    def pq(m, *a, **k):
        return f"p {m.p}, q {m.q}"

    targets = [  # (owner, attribute, label, shape_of)
        (
            MomentStats,
            "_update_chunk",
            "accumulate: MomentStats._update_chunk (centre, GEMMs, add into float64)",
            lambda self, x, y, w=None: f"x {tuple(x.shape)} {x.dtype} -> p {self.p}, q {self.q}",
        ),
        (MomentStats, "_zeros", "statistics zero-fill on first use (MomentStats._zeros)", lambda sh, d: str(sh)),
        (MomentStats, "_mirror", "cxx mirror (MomentStats._mirror)", None),
        (sel, "single_layer_r2", "selection: single_layer_r2 (total)", None),
        (sel, "solve", "selection: solve (Cholesky + inverse/solve)", pq),
        (sel, "grouped_r2", "selection: grouped_r2 (held-out R² from statistics)", None),
        (sel, "train_r2", "selection: train_r2 (closed-form R²)", None),
        (sel, "solve_w", "selection: solve_w (Cholesky + inverse + GEMM, no intercept)", pq),
        (solve_mod, "solve", "final fit: solve (Cholesky + solve)", pq),
        (ridge_mod.RidgeFitter, "_solve_layers", "final fit: _solve_layers (total)", None),
        (LayerStats, "moments", "LayerStats.moments (gathers)", None),
        (ridge_mod._BlockSolver, "mappings", "mapping assembly (_BlockSolver.mappings)", None),
    ]
    saved = []
    try:
        for owner, name, label, shape_of in targets:
            raw = (owner.__dict__ if isinstance(owner, type) else vars(owner)).get(name)
            if raw is None:
                continue
            saved.append((owner, name, raw))
            if isinstance(raw, staticmethod):
                setattr(owner, name, staticmethod(wrap(label, raw.__func__, shape_of)))
            else:
                setattr(owner, name, wrap(label, raw, shape_of))
        t0 = time.perf_counter()
        side.fit(list(batches), n)
        total = time.perf_counter() - t0
    finally:
        for owner, name, raw in reversed(saved):
            setattr(owner, name, raw)
    return {
        "total_s": total,
        "parts": {
            k: {"s": round(v, 4), "share": round(v / total, 3), "calls": calls[k], "shapes": sorted(shapes[k])}
            for k, v in secs.items()
        },
    }


# -- accuracy -------------------------------------------------------------------------------------------------------
def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-300))


def save_map(m, path: str) -> None:
    """A fitted mapping's weights, biases, layer selection and selection scores (``--save``)."""
    from safetensors.torch import save_file

    tensors = {"scores": torch.tensor(m.report.selection_scores["mean"], dtype=F64)}
    for t, lm in enumerate(m.layers):
        tensors[f"{t}.sources"] = torch.tensor(list(lm.sources), dtype=torch.int64)
        for x in ("wk", "bk", "wv", "bv"):
            tensors[f"{t}.{x}"] = getattr(lm, x).contiguous()
    save_file(tensors, path)


def load_map(path: str):
    """What :func:`save_map` wrote, shaped like a mapping for :func:`compare` (``--against``)."""
    from types import SimpleNamespace

    from safetensors.torch import load_file

    d = load_file(path)
    n = len([k for k in d if k.endswith(".sources")])
    layers = [
        SimpleNamespace(
            sources=tuple(int(i) for i in d[f"{t}.sources"]), **{x: d[f"{t}.{x}"] for x in ("wk", "bk", "wv", "bv")}
        )
        for t in range(n)
    ]
    return SimpleNamespace(layers=layers, report=SimpleNamespace(selection_scores={"mean": d["scores"].tolist()}))


def compare(m, base, batches, rows: int = 256) -> dict:
    """Max relative differences against ``base``; ``identical``: every weight, bias and score bitwise equal."""
    xk, _, xv, _ = batches[0]
    xk, xv = xk[:rows].reshape(rows, xk.shape[1], -1), xv[:rows].reshape(rows, xv.shape[1], -1)
    out = {"w": 0.0, "b": 0.0, "mapped_k": 0.0, "mapped_v": 0.0, "same_selection": True}
    same = True
    sm, sb = (torch.tensor(x.report.selection_scores["mean"], dtype=F64) for x in (m, base))
    out["scores_abs"] = float((sm - sb).abs().max())
    same = torch.equal(sm, sb)
    for lm, lb in zip(m.layers, base.layers):
        out["same_selection"] &= tuple(lm.sources) == tuple(lb.sources)
        for c, x in (("k", xk), ("v", xv)):
            w, b, wb, bb = getattr(lm, "w" + c), getattr(lm, "b" + c), getattr(lb, "w" + c), getattr(lb, "b" + c)
            same = same and tuple(lm.sources) == tuple(lb.sources) and torch.equal(w, wb) and torch.equal(b, bb)
            out["w"] = max(out["w"], rel(w, wb))
            out["b"] = max(out["b"], rel(b, bb))
            feats = x[:, list(lb.sources)].reshape(rows, -1).double()
            out["mapped_" + c] = max(
                out["mapped_" + c], rel(feats @ w.double() + b.double(), feats @ wb.double() + bb.double())
            )
    out["identical"] = bool(same)
    return out


# -- alpha=auto: per-alpha Cholesky vs one eigendecomposition ---------------------------------------------------------
def eig_bench(p: int = 512, q: int = 256, n: int = 4096, grid: int = 9, inner: int = 3) -> dict:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, p, generator=g, dtype=F64) @ (
        torch.eye(p, dtype=F64) + 0.1 * torch.randn(p, p, generator=g, dtype=F64)
    )
    y = x @ torch.randn(p, q, generator=g, dtype=F64) + torch.randn(n, q, generator=g, dtype=F64)
    xc, yc = x - x.mean(0), y - y.mean(0)
    a, cxy = xc.T @ xc, xc.T @ yc
    scale = float(a.diagonal().mean())
    lams = [scale * 10.0**e for e in range(-6, -6 + grid)]

    def chol():
        return [_batched_solve(a, cxy, lam) for lam in lams]

    def eig():
        e, v = torch.linalg.eigh(a)
        vc = v.T @ cxy
        return [v @ (vc / (e + lam)[:, None]) for lam in lams]

    times = {"cholesky_per_alpha": [], "eigh_once": []}
    ref, alt = chol(), eig()
    for _ in range(inner):
        for name, fn in (("cholesky_per_alpha", chol), ("eigh_once", eig)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {
        "p": p,
        "q": q,
        "alphas": grid,
        **{k: statistics.median(v) for k, v in times.items()},
        "max_rel_w": max(rel(b_, a_) for a_, b_ in zip(ref, alt)),
    }


# -- GEMM throughput: float64 addmm into the statistics vs a float32 product added into them ----------------------
def gemm_bench(p: int = 3072, q: int = 7168, rows=(409, 1024), inner: int = 3) -> dict:
    out = {}
    for m in rows:
        x, y = torch.randn(m, p), torch.randn(m, q)
        cxx, cxy = torch.zeros(p, p, dtype=F64), torch.zeros(p, q, dtype=F64)
        x64, y64 = x.double(), y.double()

        def f64():
            cxx.addmm_(x64.T, x64)
            cxy.addmm_(x64.T, y64)

        def f32_merge():
            cxx.add_(x.T @ x)
            cxy.add_(x.T @ y)

        def f32_only():
            return x.T @ x, x.T @ y

        flop = 2 * m * (p * p + p * q) / 1e9
        for name, fn in (("float64_addmm", f64), ("float32_gemm_merge", f32_merge), ("float32_gemm_only", f32_only)):
            fn()
            ts = []
            for _ in range(inner):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            t = statistics.median(ts)
            out[f"{name}@{m}"] = {"s": round(t, 4), "gflops": round(flop / t, 1)}
    return out


# -- main -----------------------------------------------------------------------------------------------------------
def run(args) -> dict:
    src, tgt = parse_geometry(args.geometry)
    side = Ours(src, tgt)
    batches, true = fit_batches(src, tgt, args.obs, batch=args.batch)
    if args.spread or args.offset:
        scale = 10.0 ** torch.linspace(-args.spread / 2, args.spread / 2, src[1] * src[2])
        batches = [
            (xk * scale.view(src[1], src[2]) + args.offset, yk, xv * scale.view(src[1], src[2]) + args.offset, yv)
            for xk, yk, xv, yv in batches
        ]
    parts = args.parts.split(",")
    result = {
        "spread": args.spread,
        "offset": args.offset,
        "obs": args.obs,
        "geometry": args.geometry,
        "top_k": TOP_K,
        "alpha": ALPHA,
        "reference": args.reference,
        "threads": {},
    }
    cands = [c for c in args.candidates.split(",") if c]
    for c in cands:
        if not set(c.split("+")) <= set(PARTS):
            raise SystemExit(f"unknown candidate {c!r}: use parts {','.join(PARTS)} joined by '+'")
    for th in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(th)
        row: dict = {}
        if "profile" in parts:
            row["profile"] = profile(side, batches, args.obs)
        if "fit" in parts:
            times, maps = {c: [] for c in cands}, {}
            for r in range(args.repeats):
                order = cands if r % 2 == 0 else cands[::-1]
                for c in order:
                    with patched(c):
                        t0 = time.perf_counter()
                        _, _, _, m = side.fit(list(batches), args.obs)
                        times[c].append(time.perf_counter() - t0)
                    maps.setdefault(c, m)
            base = maps.get(args.reference)
            saved = load_map(args.against) if args.against else None
            row["fit"] = {
                c: {
                    "median_s": statistics.median(times[c]),
                    "runs_s": [round(t, 3) for t in times[c]],
                    **({"accuracy": compare(maps[c], base, batches)} if base is not None else {}),
                    **({"against_saved": compare(maps[c], saved, batches)} if saved is not None else {}),
                }
                for c in cands
            }
            if args.save:
                save_map(maps[cands[0]], args.save)
        if "gemm" in parts:
            row["gemm"] = gemm_bench()
        if "eig" in parts:
            row["eig"] = eig_bench()
        result["threads"][str(th)] = row
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--obs", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--geometry", default=GEOMETRY)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", default="profile,fit")
    ap.add_argument("--candidates", default=DEFAULT_CANDIDATES)
    ap.add_argument("--reference", default="base", help="the candidate the accuracy is measured against")
    ap.add_argument("--spread", type=float, default=0.0, help="decades of scale across source feature dims")
    ap.add_argument("--offset", type=float, default=0.0, help="added to every source feature")
    ap.add_argument("--json", default=None, help="also write the result here")
    ap.add_argument(
        "--save", default=None, help="write the first candidate's fitted mapping here (safetensors; per thread count)"
    )
    ap.add_argument(
        "--against",
        default=None,
        help="also compare every candidate with a mapping --save wrote (e.g. by another kvbridge tree on PYTHONPATH)",
    )
    args = ap.parse_args(argv)
    res = run(args)
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
