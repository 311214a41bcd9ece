"""Measured rates for the resource planner's time estimate (imports torch; the plan itself does not).

A fit's time is more than its FLOPs at peak: the forwards run at the rate a decoder layer
reaches at the fit's batch shape (norms, RoPE, softmax and the cache copies included), the
float64 statistics GEMMs and the small Cholesky solves at their own rates, and some work is
memory-bound (the zero-filled statistics, the sha256 weights fingerprint of both models). :func:`measure_rates` times each of those on this
machine in a few seconds, at the plan's shapes:

- ``source_forward`` / ``target_forward``: one decoder layer of each model, built from its
  config with random weights (no weights loaded; vocabulary cut to 512, which only the
  embedding lookup sees), run through the fit's own path (``adapter.extract`` with
  ``logits_to_keep=1``, then ``strip_rope``) on ``min(batch, 2048 // seq_len)`` sequences
  of ``seq_len`` tokens; FLOP/s = the plan's FLOPs of that layer / its time;
- ``gemm64``: ``addmm_`` of ``Xᵀ X`` in float64 at the statistics' width (capped at 1,536)
  and one batch's rows (capped at 1,024): the rate of ``-o gram_dtype=float64`` and of the
  block-diagonal (selection) passes;
- ``gemm32``: the float32 Gram (``-o gram_dtype=float32``, the default) as
  :class:`~kvbridge.fit.stats.MomentStats` runs it on one 1,024-row chunk (centring, the upper
  block triangle of ``XᵀX`` and ``XᵀY`` in float32, their adds into the float64 statistics) at
  the statistics' width (capped at 1,536) and target width (capped at 4,096), in the plan's
  FLOPs (``2·rows·(p² + p·q)``, the full ``p²``: the triangle's saving shows as rate);
- ``solve64``: the selection solve as :mod:`kvbridge.fit.solve` runs it (Cholesky, SPD
  inverse, the two GEMMs with the right-hand sides) at the source layer's width;
- ``memory``: bytes/s of zero-filling fresh memory (first touch, 64 MiB), the rate at which the
  statistics are allocated (the moment blocks copied out for the solves, 0.2-0.3 s against a
  0.9-1.1 s fill on SmolLM2, are not counted);
- ``hash``: bytes/s of the weights fingerprint (tensor bytes out + sha256).

Times are the median of a few runs (at least half a second of them, after a warm-up): in CPU
seconds of this process on a CPU with one thread (the fits this is checked against are timed the
same way; robust to a shared machine), else in wall
seconds (synchronised on a GPU), so the estimate is in the same seconds as the fit would take.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from kvbridge.fit.plan import model_size, solve_flops
from kvbridge.fit.stats import MomentStats

FWD_TOKENS = 2048  # tokens of one timed forward (batch x seq_len, at least one sequence)
CAL_VOCAB = 512


@dataclass(frozen=True)
class PlanRates:
    """Rates of the parts of a fit (see the module docstring); FLOP/s and bytes/s."""

    source_forward: float
    target_forward: float
    gemm64: float
    solve64: float
    memory: float
    hash: float
    device: str = "cpu"
    threads: int = 1
    #: the float32-Gram statistics' rate (plan FLOPs/s); None (rates measured before it existed): ``gemm64``
    gemm32: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _clock(device: str):
    if device == "cpu":  # one thread: CPU seconds (robust to a shared machine); more: wall seconds
        return time.process_time if torch.get_num_threads() == 1 else time.perf_counter

    def wall():
        torch.cuda.synchronize()
        return time.perf_counter()

    return wall


MIN_TIMED_S = 0.5  # time at least this much of repeated runs: short runs scatter by a third


def _typical(fn, reps: int, clock) -> float:
    """Median of at least ``reps`` timed runs of ``fn`` after one warm-up, repeating (up to 50
    runs) until ``MIN_TIMED_S`` of runs are timed. The median, not the fastest run: a fit is
    minutes of the same work, so it runs at the machine's typical speed, and on this shared CPU
    one GEMM's time scatters by +-25% run to run (a 30 ms forward timed twice, best of two,
    scattered by 37% between calibrations of one process)."""
    fn()  # warm-up
    times: list = []
    while len(times) < reps or (sum(times) < MIN_TIMED_S and len(times) < 50):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return max(statistics.median(times), 1e-9)


def layer_forward_rate(
    ref: str, *, seq_len: int, batch_size: int, dtype: str = "float32", device: str = "cpu", reps: int = 2
) -> float:
    """FLOP/s of one decoder layer of ``ref`` (random weights) through the fit's extract + strip path."""
    from kvbridge.models import resolve
    from kvbridge.plugins import get_host

    size = model_size(ref)
    cfg = dict(resolve(ref).config)
    cfg.update(num_hidden_layers=1, vocab_size=CAL_VOCAB, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    cfg.pop("layer_types", None)  # per-layer lists follow the layer count
    host = get_host()
    adapter = host.adapter_for(cfg)
    model = adapter.build_model(cfg, dtype=dtype if dtype != "auto" else "float32").to(device)
    spec = adapter.spec_of(model)
    rows = max(1, min(batch_size, FWD_TOKENS // max(1, seq_len)))
    ids = torch.randint(0, CAL_VOCAB, (rows, seq_len), generator=torch.Generator().manual_seed(0)).to(device)

    def run():
        with torch.no_grad():
            adapter.extract(model, ids, spec=spec).strip_rope(host=host)

    seconds = _typical(run, reps, _clock(device))
    return size.forward_flops(rows * seq_len, seq_len) / size.layers / seconds  # one layer's FLOPs per second


def gemm64_rate(p: int, rows: int, device: str = "cpu", reps: int = 3) -> float:
    p, rows = max(8, min(p, 1536)), max(8, min(rows, 1024))
    x = torch.randn(rows, p, dtype=torch.float64, device=device)
    c = torch.zeros(p, p, dtype=torch.float64, device=device)
    return 2 * rows * p * p / _typical(lambda: c.addmm_(x.T, x), reps, _clock(device))


def gemm32_rate(p: int, q: int, rows: int, device: str = "cpu", reps: int = 3) -> float:
    """Plan FLOP/s (``2·rows·(p² + p·q)``) of one float32-Gram chunk update of the statistics."""
    p, q, rows = max(8, min(p, 1536)), max(8, min(q, 4096)), max(8, min(rows, 1024))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, p, generator=g).to(device)
    y = torch.randn(rows, q, generator=g).to(device)
    st = MomentStats(p, q, device=device, gram_dtype="float32")
    return 2 * rows * (p * p + p * q) / _typical(lambda: st.update(x, y), reps, _clock(device))


def solve64_rate(p: int, q: int, device: str = "cpu", reps: int = 3) -> float:
    """FLOP/s of :func:`kvbridge.fit.solve.solve` + its held-out SSE at ``p`` features, ``q`` outputs."""
    p, q = max(8, min(p, 2048)), max(8, min(q, 4096))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4 * p, p, dtype=torch.float64, generator=g).to(device)
    a = x.T @ x
    cxy = torch.randn(p, q, dtype=torch.float64, generator=g).to(device)

    def run():
        m = a.clone()
        m.diagonal().add_(0.01)
        chol, _ = torch.linalg.cholesky_ex(m)
        w = torch.cholesky_inverse(chol) @ cxy if q >= p else torch.cholesky_solve(cxy, chol)
        cw = a @ w
        return (w * cw).sum(0) - 2 * (w * cxy).sum(0)

    return solve_flops(p, q) / _typical(run, reps, _clock(device))


def memory_rate(device: str = "cpu", nbytes: int = 64 << 20, reps: int = 3) -> float:
    """Bytes/s of zero-filling fresh memory (first touch: what allocating the statistics costs)."""
    return nbytes / _typical(lambda: torch.zeros(nbytes // 8, dtype=torch.float64, device=device), reps, _clock(device))


def hash_rate(nbytes: int = 32 << 20, reps: int = 3) -> float:
    """Bytes/s of the weights fingerprint's work: tensor bytes out, then sha256."""
    t = torch.ones(nbytes // 4, dtype=torch.float32)

    def run():
        hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()

    return nbytes / _typical(run, reps, _clock("cpu"))


def measure_rates(
    source_ref: str,
    target_ref: str,
    *,
    seq_len: int = 512,
    batch_size: int = 4,
    stride: int = 4,
    top_k: int = 4,
    dtype: str = "float32",
    device: str = "cpu",
) -> PlanRates:
    """Time each part of a fit of ``source_ref -> target_ref`` at its shapes, here (a few seconds)."""

    s, t = model_size(source_ref), model_size(target_ref)
    shape = dict(seq_len=seq_len, batch_size=batch_size, dtype=dtype, device=device)
    src_rate = layer_forward_rate(source_ref, **shape)
    rows = batch_size * len(range(0, seq_len, stride))
    return PlanRates(
        source_forward=src_rate,
        target_forward=src_rate if target_ref == source_ref else layer_forward_rate(target_ref, **shape),
        gemm64=gemm64_rate(s.layers * s.kv_features, rows, device),
        gemm32=gemm32_rate(s.layers * s.kv_features, t.layers * t.kv_features, rows, device),
        solve64=solve64_rate(s.kv_features, t.layers * t.kv_features, device),
        memory=memory_rate(device),
        hash=hash_rate(),
        device=device,
        threads=torch.get_num_threads(),
    )
