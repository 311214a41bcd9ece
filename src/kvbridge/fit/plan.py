"""Resource plan of a fit, from the two models' configs (or manifests) alone: no weights, no torch.

``kvbridge fit SOURCE TARGET --plan`` and ``kvbridge.fit.plan(source_ref, target_ref, ...)``
print, before any work, what a ``ridge`` (or ``ridge-headwise``) fit of the pair costs:

- **statistics memory**: the float64 sufficient statistics, with the fitter's own blocking
  rule (:func:`kvbridge.fit.ridge.plan_blocks`, the same memory model as
  :class:`~kvbridge.fit.stats.LayerStats`): one joint pass when it fits ``memory_budget``,
  else selection passes and fit passes over blocks of target layers (each pass re-runs both
  models over the corpus); plus the chunk workspace, one calibration batch (both models'
  forwards, their caches' K/V and the sampled float32 rows: :func:`calibration_batch_bytes`,
  outside ``--memory``, scaled by ``--batch-size``) and the two models' weights;
- **artifact size**: ``mapping.safetensors`` (float32 weights and biases + header);
- **FLOPs**: the forwards of both models over the calibration tokens (per pass: ``2·N`` per
  token for ``N`` non-embedding weights, plus causal attention), the statistics GEMMs
  (``2·n·(p² + p·q)`` for K and V; float32 for the full co-moments with ``-o gram_dtype=float32``,
  the default, float64 otherwise) and the solves;
- **time**, either from measured rates (``rates``: a :class:`~kvbridge.fit.plan_rates.PlanRates`
  from :func:`~kvbridge.fit.plan_rates.measure_rates`, ``kvbridge fit --plan --calibrate``):
  the sum of the parts — both models' forwards at the rate one of their decoder layers
  reaches at the fit's batch shape, the statistics GEMMs at the rate of the dtype each pass
  runs them in (``gemm32`` / ``gemm64``), the solves at their float64 rate, the memory-bound work (the statistics zero-filled on allocation, every pass) and the
  weights fingerprint of both models (sha256) —
  checked within 15% of measured fits on the zoo and SmolLM2 (``bench/bench_plan.py``); or
  at a given peak rate (``device_flops`` for the forwards and the float32 Gram, ``device_flops64``
  for the float64 work): FLOPs / rate, a lower bound at full utilisation (``efficiency`` scales the forward
  rate; real fits on the CPU here take 1.2-1.4x that bound).

Where the fit passes depend on the layer selection (blocked fits), the plan takes the worst
case (every target layer of a block selects different source layers) and says so.
The module is callable: ``kvbridge.fit.plan(...)`` is :func:`plan`.
"""

from __future__ import annotations

import math
import os
import sys
import types
from dataclasses import asdict, dataclass, field
from typing import Any

from kvbridge.errors import ConfigError

from kvbridge.dtypes import DTYPE_BYTES  # noqa: E402  (the one table)
from kvbridge.sizes import GIB, fmt_size as _size, gib_flag  # noqa: E402  (the one size format)

WB = ("wk", "bk", "wv", "bv")  # a mapping's tensors per target layer
UNGATED_MLP = {"gpt2", "gpt_neox", "gptj", "phi", "falcon", "codegen", "starcoder2", "bloom", "opt"}
DEFAULT_TOKENS = 1_000_000


@dataclass(frozen=True)
class ModelSize:
    """What the plan needs of one model: cache geometry and weight counts (from its config)."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    attn_width: int  # query heads x head dim
    params: int  # every weight, embeddings included
    forward_params: int  # weights a token's forward multiplies (no input embedding; no LM head: logits_to_keep=1)
    embed_params: int = 0  # vocabulary x hidden (the input embedding; the LM head has as many, tied or not)
    hidden: int = 0  # residual width
    intermediate: int = 0  # MLP width
    gated_mlp: bool = True  # gate and up projections (SwiGLU-style) rather than one up projection

    @property
    def state_params(self) -> int:
        """Weights in the state dict (a tied LM head is listed, and fingerprinted, under both names)."""
        return self.forward_params + 2 * self.embed_params

    @property
    def kv_features(self) -> int:
        return self.kv_heads * self.head_dim

    def forward_flops(self, tokens: int, seq_len: int) -> float:
        """FLOPs of prefill forwards over ``tokens`` tokens in sequences of ``seq_len`` (causal attention)."""
        attention = 2 * 2 * self.layers * self.attn_width * (seq_len + 1) / 2  # QKᵀ and AV per token
        return tokens * (2 * self.forward_params + attention)


def _get(config: dict, *keys, default=None):
    for k in keys:
        if config.get(k) is not None:
            return config[k]
    return default


def model_size(ref: str) -> ModelSize:
    """:class:`ModelSize` of a model reference (folder, GGUF, manifest name, zoo:NAME ...), torch-free."""
    from kvbridge.models import resolve

    resolved = resolve(ref)
    spec = resolved.spec()
    cfg = dict(resolved.config)
    cfg.update(cfg.get("text_config") or {})
    hidden = int(_get(cfg, "hidden_size", "n_embd", "d_model", default=spec.num_attention_heads * spec.head_dim))
    vocab = int(_get(cfg, "vocab_size", default=spec.vocab_size or 0))
    inter = int(_get(cfg, "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size") or 4 * hidden)
    heads = int(spec.num_attention_heads or _get(cfg, "num_attention_heads", "n_head", default=1))
    layers, kv, hd = spec.num_layers, spec.num_kv_heads, spec.head_dim
    attn = hidden * heads * hd * 2 + hidden * kv * hd * 2  # q, o + k, v
    gated = cfg.get("model_type") not in UNGATED_MLP
    body = layers * (attn + (3 if gated else 2) * hidden * inter)
    tied = bool(_get(cfg, "tie_word_embeddings", default=False))
    params = body + vocab * hidden * (1 if tied else 2)
    return ModelSize(
        resolved.name,
        layers,
        kv,
        hd,
        attn_width=heads * hd,
        params=params,
        forward_params=body,
        embed_params=vocab * hidden,
        hidden=hidden,
        intermediate=inter,
        gated_mlp=gated,
    )


def forward_activation_bytes(m: ModelSize, rows: int, dtype_bytes: int) -> int:
    """Transient bytes of one prefill forward over ``rows`` tokens (batch x sequence length), beyond
    its cache: the widest point of one decoder layer, the MLP (the residual stream, its normed copy
    and the output: 3 x hidden; the gate and up projections and their product: 3 x intermediate,
    2 when ungated). Attention is assumed fused (no ``[heads, T, T]`` scores kept), the logits
    are of the last token only."""
    return int(rows) * (3 * m.hidden + (3 if m.gated_mlp else 2) * m.intermediate) * int(dtype_bytes)


def calibration_batch_bytes(
    s: ModelSize, t: ModelSize, *, batch: int, seq_len: int, rows: int, dtype_bytes: int
) -> int:
    """Peak bytes of one calibration batch beyond the statistics and their workspace
    (:meth:`kvbridge.fit.calibrate.PairedCalibration.features`): ``batch`` sequences of ``seq_len``
    tokens through each model in turn, ``rows`` observations sampled from them.

    Per model: its cache's K/V (``2·L·batch·seq_len·H·D`` in the load dtype), the forward's
    activations (:func:`forward_activation_bytes`) beside the growing cache, then the cache copied
    out once; its sampled rows as float32 ``2·rows·L·H·D``. The phases, in order: the source's
    forward; its rows taken from its K/V; the target's forward beside the source's rows; the
    target's rows beside its K/V and the source's rows. The largest phase is the batch's need."""
    tokens = int(batch) * int(seq_len)

    def kv(m):
        return 2 * m.layers * tokens * m.kv_features * int(dtype_bytes)

    def extract(m):
        return max(forward_activation_bytes(m, tokens, dtype_bytes) + kv(m), 2 * kv(m))

    def sampled(m):
        return 2 * int(rows) * m.layers * m.kv_features * 4

    return max(
        extract(s),
        kv(s) + sampled(s),
        sampled(s) + extract(t),
        sampled(s) + kv(t) + sampled(t),
    )


#: the workspace one accumulation job converts and centres its batch in holds about this many
#: bytes: a batch of more than ``WORKSPACE_BYTES / (itemsize·(p + q))`` rows is taken in row chunks
#: (:class:`kvbridge.fit.stats.MomentStats`), so no buffer grows with the batch or the corpus
WORKSPACE_BYTES = 32 << 20
#: float64 row chunks never smaller than this (the statistics GEMMs' inner dimension stays large) and
#: never larger than the other (larger inner dimensions run no faster)
MIN_CHUNK_ROWS, MAX_CHUNK_ROWS = 128, 512
#: the dtype of the statistics GEMMs of a full (unweighted) co-moment (``-o gram_dtype=``): each chunk
#: is centred on its float64 mean and its float32 products added into the float64 statistics
GRAM_DTYPES = ("float32", "float64")
DEFAULT_GRAM_DTYPE = "float32"
#: float32 chunks: each chunk's products are added into the float64 statistics (``p²/2 + pq`` adds),
#: so fewer, larger chunks (issue 35: a float32 Gram pays only from ~1,024 rows); 1,024 float32 rows
#: are the bytes of 512 float64 ones
F32_CHUNK_ROWS = 1024
#: the float32 products are taken in strips of this many feature rows (``XcᵀXc``: its upper block
#: triangle only), so the float32 product temporary is one strip, never ``p × q``
GRAM_STRIP = 512
#: rows per float32 -> float64 add of a product strip into the statistics: the cast's float64 temporary
#: stays in cache (a whole strip's cast is a fresh float64 copy of it, ~1.5x slower on the CPU here
#: and, past glibc's mmap threshold, new pages)
ADD_ROWS = 32


def chunk_rows(p: int, q: int, budget: int = WORKSPACE_BYTES, gram_dtype: str = "float64") -> int:
    """Rows of one workspace chunk for ``p`` features and ``q`` targets (``gram_dtype``: the GEMMs' dtype)."""
    if gram_dtype == "float32":
        return F32_CHUNK_ROWS
    return max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, int(budget) // (8 * max(1, p + q))))


def workspace_bytes(p: int, q: int, rows: int | None = None, gram_dtype: str = "float64") -> int:
    """Bytes of the workspace of one accumulation job (``rows``: the largest batch, if known): the
    chunk (float64; or float32 + one reused float32 product strip of :data:`GRAM_STRIP` feature rows
    and the float64 cast of :data:`ADD_ROWS` of its rows that each add into the statistics makes)."""
    step = chunk_rows(p, q, gram_dtype=gram_dtype)
    r = step if rows is None else min(int(rows), step)
    if gram_dtype == "float32":
        return 4 * r * (p + q) + (4 * min(GRAM_STRIP, p) + 8 * min(ADD_ROWS, p)) * max(p, q)
    return 8 * r * (p + q)


def job_bytes(
    n_src: int,
    n_tgt: int,
    fs: int,
    hs_dim: int,
    ft: int,
    xx_block: str = "full",
    gram_dtype: str = DEFAULT_GRAM_DTYPE,
    splits: int = 2,
) -> int:
    """What one accumulation job holds at its peak: its statistics + its workspace (the blocking rule;
    ``gram_dtype`` applies to ``full`` co-moments, block-diagonal ones accumulate in float64)."""
    ws = workspace_bytes(n_src * fs, n_tgt * ft, gram_dtype=gram_dtype if xx_block == "full" else "float64")
    return layer_stats_bytes(n_src, n_tgt, fs, hs_dim, ft, xx_block, splits) + ws


def layer_stats_bytes(
    n_src: int, n_tgt: int, fs: int, hs_dim: int, ft: int, xx_block: str = "full", splits: int = 2
) -> int:
    """Bytes of one accumulation job: K, V x the ``splits`` that get observations (train, and held-out
    unless there is none: an empty split's :class:`MomentStats` allocate nothing)."""
    p, q = n_src * fs, n_tgt * ft
    xx = {"full": p * p, "layer": p * fs, "head": p * hs_dim}[xx_block]
    return 2 * int(splits) * 8 * (xx + p * q + 2 * p + 2 * q)


def solve_flops(p: int, q: int) -> float:
    """FLOPs of one ridge solve + held-out SSE (:mod:`kvbridge.fit.solve`): ``p`` features, ``q`` outputs.

    Cholesky ``p³/3``, the SPD inverse ``2p³/3`` when ``q >= p`` (else two triangular solves,
    counted in the ``2p²q``), ``(Cxx+λI)⁻¹ Cxy`` and the held-out ``Cxx W``: ``2p²q`` each.
    """
    return p**3 / 3 + (2 * p**3 / 3 if q >= p else 0.0) + 4 * p * p * q


def pack_blocks(n: int, bytes_of, budget: int, what: str, error: type = ConfigError) -> list[list[int]]:
    """Consecutive blocks of ``range(n)`` whose ``bytes_of(block)`` stays within ``budget``.

    The one blocking rule of the planner and the fitters (:func:`kvbridge.fit.solve.plan_blocks`);
    a single target layer alone over the budget is an ``error`` (:func:`budget_refusal` of ``what``
    and the largest single target layer's need, the smallest budget this blocking works in).
    """
    blocks, cur = [], []
    for i in range(n):
        if cur and bytes_of(cur + [i]) > budget:
            blocks.append(cur)
            cur = []
        cur.append(i)
        if bytes_of(cur) > budget:
            raise error(*budget_refusal(what, budget, max(bytes_of([j]) for j in range(n))))
    if cur:
        blocks.append(cur)
    return blocks


def minimum_budget(
    fitter: str, n_src: int, n_tgt: int, fs: int, hs_dim: int, ft: int, top_k: int, splits: int = 2
) -> int:
    """The smallest statistics budget (bytes) a ``ridge`` / ``ridge-headwise`` fit of these shapes runs
    in: its largest one-target-layer job. Ridge: the layer selection of one target layer (every
    source layer, per-layer blocks) or the fit of one target layer (its ``top_k`` source layers,
    full), whichever is larger; headwise: one target layer against every source head. ``splits``:
    as in :func:`layer_stats_bytes` (1 when no sequence is held out)."""
    if fitter == "ridge-headwise":
        return job_bytes(n_src, 1, fs, hs_dim, ft, "head", splits=splits)
    k = min(int(top_k), n_src)
    if k >= n_src:  # every source layer: one target layer's fit is the joint job's smallest block
        return job_bytes(n_src, 1, fs, hs_dim, ft, "full", splits=splits)
    return max(
        job_bytes(n_src, 1, fs, hs_dim, ft, "layer", splits=splits),
        job_bytes(k, 1, fs, hs_dim, ft, "full", splits=splits),
    )


def default_budget(error: type = ConfigError) -> int:
    """The statistics budget (bytes) when none is given: ``$KVBRIDGE_FIT_MEMORY`` GiB, else 8 GiB."""
    raw = os.environ.get("KVBRIDGE_FIT_MEMORY")
    try:
        return int(float(raw) * GIB) if raw else 8 * GIB
    except ValueError:
        raise error(f"KVBRIDGE_FIT_MEMORY={raw!r} is not a number of GiB", "set e.g. KVBRIDGE_FIT_MEMORY=8") from None


def budget_refusal(what: str, budget: int, minimum: int) -> tuple[str, str]:
    """``(what, fix)`` of a refused ``--memory``: the sizes in units that show, and the smallest
    workable budget as the flag's value (rounded up, so passing it is enough)."""
    return (
        f"{what} needs at least {_size(minimum)} (statistics + workspace of its largest one-target-layer "
        f"pass), over the {_size(budget)} budget",
        f"pass --memory {gib_flag(minimum)} or more (the smallest workable budget, GiB), lower --top-k or use "
        "--fitter ridge-headwise",
    )


def check_choice(name: str, value, choices, error: type = ConfigError) -> None:
    if value not in choices:
        raise error(f"-o {name}={value!r} is not one of {', '.join(choices)}", f"use e.g. -o {name}={choices[0]}")


def check_minimum(
    fitter: str, budget: int, n_src: int, n_tgt: int, fs: int, hs_dim: int, ft: int, top_k: int, splits: int = 2
) -> None:
    """Refuse a ``budget`` below :func:`minimum_budget` of these shapes (:func:`budget_refusal`)."""
    minimum = minimum_budget(fitter, n_src, n_tgt, fs, hs_dim, ft, top_k, splits)
    if minimum > budget:
        what = f"the {fitter} fit" + (f" (top-k {min(int(top_k), n_src)})" if fitter == "ridge" else "")
        raise ConfigError(*budget_refusal(what, budget, minimum))


@dataclass(frozen=True)
class Pass:
    tag: str
    target_layers: tuple
    source_layers: int
    statistics_bytes: int
    statistics_flops: float


@dataclass(frozen=True)
class FitPlan:
    """The plan (see the module docstring); :meth:`lines` renders it."""

    source: ModelSize
    target: ModelSize
    fitter: str
    top_k: int
    tokens: int
    observations: int  # per (layer, head), train + held-out
    memory_budget: int
    passes: tuple
    statistics_bytes: int  # peak: the largest pass
    batch_buffer_bytes: (  # the workspace (float32 or float64 chunks) the peak pass adds to the largest
        int  # statistics (+ the attention recording, weighting=attention)
    )
    weights_bytes: int  # both models in the load dtype
    artifact_bytes: int
    forward_flops: float  # all passes
    statistics_flops: float
    solve_flops: float
    statistics_flops32: float = 0.0  # of statistics_flops: the passes whose co-moments run as float32 GEMMs
    device_flops: float | None = None
    device_flops64: float | None = None
    efficiency: float = 1.0
    worst_case: bool = False
    notes: tuple = field(default_factory=tuple)
    source_forward_flops: float = 0.0  # of forward_flops: the source's share
    memory_traffic_bytes: int = 0  # memory-bound work: the statistics zero-filled (first touch), every pass
    hash_bytes: int = 0  # weights fingerprinted (both models, state-dict bytes)
    rates: object = None  # a kvbridge.fit.plan_rates.PlanRates (measured), or None
    measured: tuple = ()  # kvbridge's own measured verdicts on this pair (kvbridge.check.measured)
    calibration_bytes: int = 0  # one calibration batch: forwards, caches' K/V, sampled rows (calibration_batch_bytes)
    batch_size: int = 4
    seq_len: int = 512

    @property
    def fit_bytes(self) -> int:
        """The fit's memory above the two models' weights: statistics + workspace + one calibration batch."""
        return self.statistics_bytes + self.batch_buffer_bytes + self.calibration_bytes

    @property
    def peak_bytes(self) -> int:
        return self.fit_bytes + self.weights_bytes

    def time_parts(self) -> dict | None:
        """Seconds per part of the fit at the measured ``rates`` (None without them)."""
        r = self.rates
        if r is None:
            return None
        return {
            "source forwards": self.source_forward_flops / r.source_forward,
            "target forwards": (self.forward_flops - self.source_forward_flops) / r.target_forward,
            "statistics": self.statistics_flops32 / _rate32(r)
            + (self.statistics_flops - self.statistics_flops32) / r.gemm64,
            "solves": self.solve_flops / r.solve64,
            "memory": self.memory_traffic_bytes / r.memory,
            "fingerprints": self.hash_bytes / r.hash,
        }

    @property
    def seconds(self) -> float | None:
        parts = self.time_parts()
        if parts is not None:
            return sum(parts.values())
        if not self.device_flops:
            return None
        f64 = self.device_flops64 or self.device_flops
        return (
            self.forward_flops / (self.device_flops * self.efficiency)
            + self.statistics_flops32 / self.device_flops  # the float32 Gram at the float32 peak
            + (self.statistics_flops - self.statistics_flops32 + self.solve_flops) / f64
        )

    def to_dict(self) -> dict:
        out = asdict(self)
        out["passes"] = [asdict(p) for p in self.passes]
        out["rates"] = None if self.rates is None else self.rates.to_dict()
        out["measured"] = [m.to_dict() for m in self.measured]
        out.update(
            fit_bytes=self.fit_bytes, peak_bytes=self.peak_bytes, seconds=self.seconds, time_parts=self.time_parts()
        )
        return out

    def lines(self) -> list[str]:
        s, t, f32 = self.source, self.target, self.statistics_flops32
        gram = "float32 Gram" if f32 >= self.statistics_flops else f"{f32:.3g} float32 Gram, the rest float64"
        out = [
            f"fit plan: {s.name} ({s.layers}x{s.kv_heads}x{s.head_dim}) -> {t.name} ({t.layers}x{t.kv_heads}x"
            f"{t.head_dim}), {self.fitter}, top-k {self.top_k}, {self.tokens:,} tokens "
            f"({self.observations:,} observations per head)",
            f"  statistics memory: {_size(self.statistics_bytes)} (float64) in {len(self.passes)} pass(es) over the "
            f"corpus; budget {_size(self.memory_budget)}",
            f"  + workspace {_size(self.batch_buffer_bytes)} + calibration batch {_size(self.calibration_bytes)} "
            f"({self.batch_size} x {self.seq_len} tokens: a forward, the caches' K/V, the sampled rows; --batch-size "
            f"scales it) = fit memory ~{_size(self.fit_bytes)} (--memory bounds the statistics + workspace)",
            f"  + both models' weights {_size(self.weights_bytes)} = peak ~{_size(self.peak_bytes)}",
            f"  artifact: {_size(self.artifact_bytes)} (mapping.safetensors, float32)",
            f"  FLOPs: forwards {self.forward_flops:.3g}, statistics {self.statistics_flops:.3g} "
            f"({gram if f32 > 0 else 'float64'}), solves {self.solve_flops:.3g}",
        ]
        parts = self.time_parts()
        if parts is not None:
            r = self.rates
            out += [
                f"  time at the rates measured on {r.device} ({r.threads} thread(s)): ~{_duration(self.seconds)} = "
                + " + ".join(f"{k} {_duration(v)}" for k, v in parts.items()),
                f"    rates: forwards {r.source_forward:.3g} / {r.target_forward:.3g} FLOP/s (source / target), "
                f"float32 Gram {_rate32(r):.3g}, float64 GEMM {r.gemm64:.3g}, solves {r.solve64:.3g} FLOP/s, "
                f"memory {r.memory / 1e9:.3g} GB/s, "
                f"sha256 {r.hash / 1e9:.3g} GB/s",
            ]
        elif self.seconds is not None:
            rate = f"{self.device_flops:.3g} FLOP/s"
            if self.device_flops64:
                rate += f" ({self.device_flops64:.3g} float64)"
            if self.efficiency != 1.0:
                rate += f", forward efficiency {self.efficiency:g}"
            out.append(f"  time at {rate}: ~{_duration(self.seconds)}")
        if len([p for p in self.passes if p.tag != "heads-weighted"]) > 1:
            out.append("  blocking plan (one joint pass does not fit the budget):")
            groups: dict = {}
            for p in self.passes:
                groups.setdefault(p.tag.rstrip("0123456789"), []).append(p)
            for kind, ps in groups.items():
                widths = [p.target_layers[1] - p.target_layers[0] + 1 for p in ps]
                out.append(
                    f"    {len(ps)} {kind} pass(es) of up to {max(widths)} target layers x up to "
                    f"{max(p.source_layers for p in ps)} source layers, up to "
                    f"{_size(max(p.statistics_bytes for p in ps))} each"
                )
        out += [f"  note: {n}" for n in self.notes]
        for m in self.measured:  # what a fit of this very pair did when kvbridge measured it
            out += ["  " + line for line in m.lines(98)]
        return out


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def safetensors_bytes(shapes: list, dtype_bytes: int = 4) -> int:
    """Size of a safetensors file of tensors with these ``(name, shape)``: 8 + header + data."""
    data = 0
    entries = []
    for name, shape in shapes:
        begin, data = data, data + dtype_bytes * math.prod(shape)
        entries.append(
            f'"{name}":{{"dtype":"F32","shape":[{",".join(map(str, shape))}],"data_offsets":[{begin},{data}]}}'
        )
    header = 2 + len(",".join(entries))  # {...}, no metadata
    return 8 + ((header + 7) // 8) * 8 + data  # the header is padded with spaces to 8 bytes


@dataclass(frozen=True)
class PlanInputs:
    """What :func:`plan` plans: the fit's settings that size it (``support`` / ``weighting``: the
    ``ridge`` options of those names), the memory budget (None: ``KVBRIDGE_FIT_MEMORY`` GiB, else
    8 GiB), the device's rates (FLOP/s; ``rates``: measured, :mod:`kvbridge.fit.plan_rates`)."""

    fitter: str = "ridge"
    top_k: int = 4
    tokens: int | None = None
    seq_len: int = 512
    stride: int = 4
    skip: int = 0
    heldout: float = 0.1
    batch_size: int = 4
    dtype: str = "float32"
    memory_budget: int | None = None
    device_flops: float | None = None
    device_flops64: float | None = None
    efficiency: float = 1.0
    rates: Any = None
    support: str = "layers"
    weighting: str = "uniform"
    gram_dtype: str = DEFAULT_GRAM_DTYPE  # the ridge option: the workspace of full-statistics passes


def plan(source_ref: str, target_ref: str, inputs: PlanInputs | None = None, **options: Any) -> FitPlan:
    """The :class:`FitPlan` of fitting ``source_ref -> target_ref`` (see the module docstring), as
    ``inputs`` (or its fields as keywords) say.

    ``weighting="attention"`` adds the weighted per-head pass
    (:class:`~kvbridge.fit.headstats.HeadStats`: one more forward of both models) and the attention
    recording's memory (:func:`attention_record_bytes`)."""
    o = inputs if inputs is not None else PlanInputs(**options)
    fitter, seq_len, batch_size, dtype_bytes = o.fitter, o.seq_len, o.batch_size, DTYPE_BYTES.get(o.dtype, 4)
    if fitter not in ("ridge", "ridge-headwise"):
        raise ConfigError(
            f"--plan knows the ridge and ridge-headwise fitters, not {fitter!r}",
            "plan with --fitter ridge (the statistics are the same)",
        )
    check_choice("gram_dtype", o.gram_dtype, GRAM_DTYPES)  # what the fit itself refuses (as a FitError)
    memory_budget = default_budget() if o.memory_budget is None else o.memory_budget
    s, t = model_size(source_ref), model_size(target_ref)
    tokens = int(o.tokens or DEFAULT_TOKENS)
    per_seq = len(range(o.skip, seq_len, o.stride))
    n_obs = (tokens // seq_len) * per_seq + len(range(o.skip, tokens % seq_len, o.stride))
    fs, ft = s.kv_features, t.kv_features
    k = min(int(o.top_k), s.layers)
    # the held-out split gets sequences only with --heldout > 0 and two or more sequences (calibrate.py)
    splits = 2 if o.heldout > 0 and -(-tokens // seq_len) >= 2 else 1
    check_minimum(fitter, memory_budget, s.layers, t.layers, fs, s.head_dim, ft, k, splits)
    notes, worst = [], False
    passes, gram_of = [], {}

    def add(tag: str, b, n_src: int, xx_block: str) -> None:  # one pass: target layers b x n_src source layers
        p = n_src * fs
        xx = {"full": p * p, "layer": p * fs, "head": p * s.head_dim}[xx_block]  # Cxx or its blocks
        nbytes = layer_stats_bytes(n_src, len(b), fs, s.head_dim, ft, xx_block, splits)
        passes.append(Pass(tag, (b[0], b[-1]), n_src, nbytes, 2 * 2 * n_obs * (xx + p * len(b) * ft)))  # K, V GEMMs
        gram_of[tag] = o.gram_dtype if xx_block == "full" else "float64"  # block-diagonal: float64 GEMMs

    def job(n_src: int, xx_block: str):  # what a block of target layers needs (the blocking rule)
        return lambda b: job_bytes(n_src, len(b), fs, s.head_dim, ft, xx_block, o.gram_dtype, splits)

    if fitter == "ridge-headwise":  # per target layer: every source head x its targets (head blocks)
        for i, b in enumerate(pack_blocks(t.layers, job(s.layers, "head"), memory_budget, "the headwise fit")):
            add(f"headwise{i}", b, s.layers, "head")
        solve = 2 * s.layers * s.kv_heads * (s.head_dim**3 / 3 + 4 * s.head_dim**2 * t.layers * ft)
        w_shape, b_shape = (t.kv_heads, s.head_dim, t.head_dim), (t.kv_heads, t.head_dim)
    else:
        if job(s.layers, "full")(range(t.layers)) <= memory_budget:
            add("joint", range(t.layers), s.layers, "full")
        else:
            for i, b in enumerate(pack_blocks(t.layers, job(s.layers, "layer"), memory_budget, "layer selection")):
                add(f"select{i}", b, s.layers, "layer")
            union = lambda b: min(s.layers, k * len(b))  # noqa: E731  worst case: no shared source layers
            fit = pack_blocks(t.layers, lambda b: job(union(b), "full")(b), memory_budget, "the joint fit")
            for i, b in enumerate(fit):
                add(f"fit{i}", b, union(b), "full")
            worst = True
            notes.append(
                "blocked fit: the fit passes assume no two target layers of a block share a source layer "
                "(worst case); shared selections make them smaller"
            )
        # selection: one solve per (source layer, K/V) against every target layer of a pass; fit: one per (target layer, K/V)
        solve = 2 * s.layers * solve_flops(fs, t.layers * ft) + 2 * t.layers * solve_flops(k * fs, ft)
        w_shape, b_shape = (k * fs, ft), (ft,)
    record = 0
    if fitter == "ridge" and o.weighting == "attention":
        p_head = k * (s.head_dim if o.support == "head-local" else fs)
        heads = t.layers * t.kv_heads
        head_flops = 2 * 2 * n_obs * heads * (p_head * p_head + p_head * t.head_dim)
        head_bytes = heads * layer_stats_bytes(1, 1, p_head, 0, t.head_dim, splits=splits)  # one target head's job
        passes.append(Pass("heads-weighted", (0, t.layers - 1), s.layers, head_bytes, head_flops))
        record = attention_record_bytes(
            batch_size,
            seq_len,
            q_heads=max(1, t.attn_width // t.head_dim),
            kv_heads=t.kv_heads,
            head_dim=t.head_dim,
            layers=t.layers,
        )
        notes.append(
            f"weighting=attention: a second pass of both models (per target head, {p_head} features, weighted); "
            f"recording the target's boundary queries and attention adds {_size(record)} per batch of "
            f"{batch_size} (one layer's [batch, query heads, 32, seq_len] scores at a time + the kept weights)"
        )
    elif fitter == "ridge" and o.support == "head-local":
        notes.append(
            f"support=head-local: each target head reads its top-{k} source heads ({k * s.head_dim} features); "
            "solved from the joint statistics (a second, per-head pass when the joint pass does not fit)"
        )
    # safetensors writes the header sorted by name
    shapes = sorted((f"layers.{j}.{n}", w_shape if n[0] == "w" else b_shape) for j in range(t.layers) for n in WB)
    peak = max(p.statistics_bytes for p in passes)
    rows = batch_size * per_seq  # observations of one batch, converted to float64 in row chunks
    # the passes run one after another: the peak is the pass whose statistics + workspace (float32
    # chunks for full statistics, else float64) are the largest; the workspace line is what it adds
    # to the largest statistics, so statistics + workspace is that peak (the flag the notes offer keeps it)
    held = max(
        p.statistics_bytes
        + workspace_bytes(
            p.source_layers * fs,
            (p.target_layers[1] - p.target_layers[0] + 1) * ft,
            rows,
            gram_of.get(p.tag, "float64"),  # the weighted per-head pass: float64
        )
        for p in passes
    )
    buffers = held - peak + record
    calibration = calibration_batch_bytes(s, t, batch=batch_size, seq_len=seq_len, rows=rows, dtype_bytes=dtype_bytes)
    over = peak + buffers + calibration - memory_budget
    if over > 0:  # the batch is outside --memory: say what --memory keeps the whole fit within this one
        inside = gib_flag(memory_budget - calibration - record, down=True)
        lowest = minimum_budget(fitter, s.layers, t.layers, fs, s.head_dim, ft, k, splits)
        fix = (
            f"pass --memory {inside} (more passes)"
            if int(float(inside) * GIB) >= lowest
            else f"pass the smallest --memory ({gib_flag(lowest)}) and a smaller --batch-size"
        )
        notes.append(
            f"--memory bounds the statistics and their workspace, not the calibration batch: the fit memory is "
            f"{_size(over)} over {_size(memory_budget)}; for a fit within {_size(memory_budget)} {fix}"
        )
    src_forwards = len(passes) * s.forward_flops(tokens, seq_len)
    return FitPlan(
        source=s,
        target=t,
        fitter=fitter,
        top_k=k,
        tokens=tokens,
        observations=n_obs,
        memory_budget=int(memory_budget),
        passes=tuple(passes),
        statistics_bytes=peak,
        batch_buffer_bytes=buffers,
        weights_bytes=(s.params + t.params) * dtype_bytes,
        artifact_bytes=safetensors_bytes(shapes),
        forward_flops=src_forwards + len(passes) * t.forward_flops(tokens, seq_len),
        statistics_flops=sum(p.statistics_flops for p in passes),
        statistics_flops32=sum(p.statistics_flops for p in passes if gram_of.get(p.tag) == "float32"),
        solve_flops=float(solve),
        device_flops=o.device_flops,
        device_flops64=o.device_flops64,
        efficiency=o.efficiency,
        worst_case=worst,
        notes=tuple(notes),
        source_forward_flops=src_forwards,
        memory_traffic_bytes=sum(p.statistics_bytes for p in passes),
        hash_bytes=(s.state_params + t.state_params) * dtype_bytes,
        rates=o.rates,
        calibration_bytes=calibration,
        batch_size=int(batch_size),
        seq_len=int(seq_len),
    )


def _rate32(rates) -> float:
    """The float32-Gram rate of ``rates`` (``gemm64`` for rates measured without one)."""
    return getattr(rates, "gemm32", None) or rates.gemm64


def attention_record_bytes(batch: int, seq_len: int, *, q_heads: int, kv_heads: int, head_dim: int, layers: int) -> int:
    """Peak bytes the attention-repair recording (:mod:`kvbridge.fit.repair`) adds to a calibration
    forward (float32): one layer's boundary scores, attention and distances ``3 x [B, H_q, U, T]``
    (``U`` <= 32 boundaries), its boundary queries and outputs, and the kept weights ``2 x [B, L, H_kv, T]``."""
    u = min(32, max(0, seq_len - 1))
    per_layer = 3 * batch * q_heads * u * seq_len + 2 * batch * q_heads * u * head_dim
    kept = 2 * batch * layers * kv_heads * seq_len
    return 4 * (per_layer + kept)


class _CallableModule(types.ModuleType):
    """``kvbridge.fit.plan`` is this module once imported: calling it calls :func:`plan`."""

    def __call__(self, *args, **kwargs) -> FitPlan:
        return plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
