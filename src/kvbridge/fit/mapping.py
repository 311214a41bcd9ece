"""The fitted mapping: per target (layer, KV head) affine maps of source content K and V.

A :class:`FittedMapping` is what :func:`kvbridge.transfer.transfer` calls: ``map_content``
takes a content-space source state (RoPE stripped) and returns a content-space target state.
Two layouts:

- ``dense`` (``ridge``, ``sklearn``): target layer t reads the KV heads of its selected source
  layers ``S(t)`` (best first); ``W [F, H_t·D_t]`` with ``F = |S(t)|·H_s·D_s`` (features in
  ``[layer, head, dim]`` order), ``b [H_t·D_t]``: ``y = x W + b`` for every token;
- ``headwise`` (``ridge-headwise``): target head h of layer t reads one source head
  ``(layer, head)``; ``W [H_t, D_s, D_t]``, ``b [H_t, D_t]``.

Compute is float32. Dense maps run as a handful of large operations per K / V (per block of
target layers one stacking copy of their selected source layers into a reused buffer, one
batched GEMM with the bias fused; float32 results returned as views of the GEMM's output in
the target layout ``[B, H_t, T, D_t]``, no layout copy: the RoPE re-application reads them and
writes the target cache in its one pass), because with the default thread count
on a busy machine every parallel region costs a scheduling round: the per-layer, per-chunk
version (about 2,700 small operations at 2,048 tokens) ran at 1.3x its GEMM floor on one thread
and 8-12x on two (BENCHMARKS.md, "Map and transfer at the default thread count").
Headwise maps keep the per-layer ``baddbmm`` over target heads. A fitted mapping is
approximate by nature: ``exact`` is False, so transferred states are marked ``approximate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kvbridge.buffers import HUGE_PAGE_MAX, HUGE_PAGE_MIN, fresh, populate, token_blocks  # noqa: F401 - re-exported
from kvbridge.errors import ArtifactError, StateError
from kvbridge.spec import ModelSpec
from kvbridge.transfer import content_geometry as geometry

MODES = ("dense", "headwise")
#: the dense map runs in blocks of this many tokens (of one batch row) per target layer: the block's
#: selected source features (2,048 tokens x top-k 4 x 2 x 64 float32 = 4 MiB) are copied into a reused
#: buffer and read back from cache by the GEMM that follows, instead of a whole target layer's
#: features going out to memory and back (64 MiB per target layer at 32,768 tokens)
TOKEN_BLOCK = 2048
#: a sequence of at most :data:`TOKEN_BLOCK` tokens is mapped per block of whole target layers (every
#: batch row and token): at most this many bytes of gathered features per block (at least one layer).
#: 4 MiB (one target layer at 2,048 tokens, as the longer map's token blocks): the GEMM reads the block
#: back from cache (inferred; measured is the time). At 32 MiB (session 8's size: all 28 target layers
#: in one ``baddbmm`` at 512 tokens, 8 at 2,048) the map was 1.11-1.19x slower at 1,024 and 2,048 tokens
#: on two threads, 1.09x at 512 and 2,048 on one (512 on two: within the children's spread), same bits
#: (BENCHMARKS.md, "Issue 35: two threads at 512 and 2,048 tokens")
GATHER_BYTES = 4 << 20


@dataclass
class LayerMap:
    """The maps of one target layer (K and V)."""

    mode: str
    sources: tuple  # dense: source layers; headwise: ((layer, head), ...) per target head
    wk: torch.Tensor
    bk: torch.Tensor
    wv: torch.Tensor
    bv: torch.Tensor

    def to(self, dtype=torch.float32, device=None) -> "LayerMap":
        return replace(self, **{n: getattr(self, n).to(dtype=dtype, device=device) for n in ("wk", "bk", "wv", "bv")})


@dataclass
class FittedMapping:
    """A fitted source -> target K/V mapping (see the module docstring)."""

    source_spec: ModelSpec
    target_spec: ModelSpec
    layers: list  # LayerMap per target layer
    fitter: str = "ridge"
    report: Any = None  # a kvbridge.fit.protocol.FitReport: selection, held-out R², warnings
    manifest: dict = field(default_factory=dict)  # set when loaded from / written to an artifact
    exact: bool = False

    @property
    def name(self) -> str:
        return self.fitter

    @property
    def mode(self) -> str:
        return self.layers[0].mode if self.layers else "dense"

    def __post_init__(self):
        if len(self.layers) != self.target_spec.num_layers:
            raise StateError(
                f"mapping has {len(self.layers)} target layers, target spec has {self.target_spec.num_layers}",
                "fit the mapping for this target",
            )
        self.layers = [lm.to(torch.float32) for lm in self.layers]

    # -- the transfer step --------------------------------------------------------------------------
    def check_pair(self, source_spec: ModelSpec, target_spec: ModelSpec) -> None:
        for role, want, got in (("source", self.source_spec, source_spec), ("target", self.target_spec, target_spec)):
            if geometry(want) != geometry(got):
                raise StateError(
                    f"mapping expects a {role} with (layers, kv_heads, head_dim)={geometry(want)}, got {geometry(got)}",
                    f"use a mapping fitted for this {role} model (kvbridge fit)",
                )

    @property
    def per_token(self) -> bool:
        """Each token's mapped K/V depends on that token's source K/V alone (no mixing across tokens),
        so :func:`kvbridge.transfer.transfer` may map a long cache in blocks of tokens. True for this
        class's own :meth:`map_tensors`; a subclass that replaces it (the translator) says so itself."""
        return type(self).map_tensors is FittedMapping.map_tensors

    def map_content(self, state, target_spec: ModelSpec | None = None, *, work: dict | None = None):
        """Content-space source state -> content-space target state, in the state's dtype (float32
        content of a half-precision cache stays float32: the transfer rounds once, after RoPE).

        ``work``: a dict the dense map keeps its buffers in between calls (see :meth:`map_tensors`)."""
        from kvbridge.kvstate import KVState

        target_spec = target_spec or self.target_spec
        if state.rope_applied and state.spec.positional == "rope":
            raise StateError("map_content needs content-space keys (RoPE stripped)", "call state.strip_rope() first")
        self.check_pair(state.spec, target_spec)
        extra = {} if work is None else {"work": work}  # a subclass's map_tensors may not take it
        keys, values = self.map_tensors(state.keys, state.values, dtype=state.dtype, **extra)
        return KVState(
            keys=tuple(keys),
            values=tuple(values),
            token_ids=state.token_ids,
            positions=state.positions,
            spec=target_spec,
            rope_applied=False,
            rope_lengths=None,
            model_fingerprint="",
            approximate=True,
            meta=dict(state.meta),
        )

    def map_tensors(self, keys, values, *, dtype=torch.float32, work: dict | None = None) -> tuple[list, list]:
        """Per-layer source content ``keys``/``values`` ``[B, H_s, T, D_s]`` -> target lists.

        ``work`` (dense): a dict the gather buffer and the results are kept in and reused by the
        next call with it (no fresh memory per call; the previous call's results are overwritten:
        for a caller that consumes each result before the next call, as the token blocks of
        :func:`kvbridge.transfer.transfer` do). Without it every call returns fresh tensors.

        Dense: :meth:`_map_dense`. Headwise, per target layer and batch row: the selected source
        heads copied into a reused buffer, one ``baddbmm`` over the target heads with the bias fused
        (through a float32 scratch tensor for another ``dtype``). No weight copies; no allocation but
        the outputs.
        """
        if self.mode == "dense":
            return self._map_dense(keys, values, dtype, work)
        _, _, ds = geometry(self.source_spec)
        b, _, t, _ = keys[0].shape
        device = keys[0].device
        ht, dt = self.target_spec.num_kv_heads, self.target_spec.head_dim
        # float32 results of a non-float32 target go through a scratch tensor
        scratch = None if dtype == torch.float32 else torch.empty(ht, t, dt, dtype=torch.float32, device=device)
        buf = torch.empty(ht, t, ds, dtype=torch.float32, device=device)  # [H_t, T, D_s], reused
        out_k, out_v = [], []
        for name, tensors, out in (("k", keys, out_k), ("v", values, out_v)):
            for sources, w, bias in self._plan(device)[name]:  # w [H_t, D_s, D_t], bias [H_t, 1, D_t]
                y = torch.empty(b, ht, t, dt, dtype=dtype, device=device)
                for r in range(b):  # target head h reads its own source head (float32, straight from the source)
                    for j, (layer, head) in enumerate(sources):
                        buf[j].copy_(tensors[layer][r, head])
                    torch.baddbmm(bias, buf, w, out=y[r] if scratch is None else scratch)
                    if scratch is not None:
                        y[r].copy_(scratch)
                out.append(y)
        return out_k, out_v

    def _map_dense(self, keys, values, dtype, work: dict | None = None) -> tuple[list, list]:
        """The dense layout. Up to :data:`TOKEN_BLOCK` tokens: per K / V and block of whole target layers
        (:data:`GATHER_BYTES` of features) one ``torch.stack`` of their selected source layers into a
        reused buffer and one ``baddbmm`` (session 8's map). Longer: per K / V, target layer and block
        of :data:`TOKEN_BLOCK` tokens, ONE
        ``torch.stack`` copies the target layer's selected source layers (the block's tokens) straight
        from the source tensors into a small reused buffer (``[T_b, k, H_s, D_s]``), and ONE ``addmm``
        (bias fused) reads it back from cache and writes the block's rows of the result
        ``[G, B·T, H_t·D_t]`` (a contiguous slice). A float32 result is returned as it is: each target
        layer's ``[B, H_t, T, D_t]`` is a permuted view of it, no layout copy (the RoPE
        re-application reads the view and writes the target layout in its one pass). Another
        ``dtype`` takes one cast into the contiguous target layout.

        Every row's GEMM is the one of a whole-cache GEMM (same features, same order, same
        weights): the results are bitwise those of one ``baddbmm`` over all tokens (the blocks are
        never under 4 rows, :func:`token_blocks`). The features of a whole target layer used to be
        gathered first (session 8's map: 64 MiB per target layer at 32,768 tokens, written to
        memory and read back by the GEMM; 1.5-2.0x its GEMM floor at 8,192 tokens against 1.2-1.6x
        in blocks, BENCHMARKS.md, "Issue 35: 32,768 tokens"). The only fresh memory per call is the
        gather buffer (a few MiB) and the results; with ``work`` none once the first call has made
        them (the buffers are kept there, keyed by their role, and the next call's results overwrite
        them).
        """
        _, hs, ds = geometry(self.source_spec)
        b, _, t, _ = keys[0].shape
        device = keys[0].device
        ht, dt = self.target_spec.num_kv_heads, self.target_spec.head_dim
        fs, rows = hs * ds, b * t
        groups = self._dense_plan(device)
        blocks = token_blocks(t, TOKEN_BLOCK)

        def alloc(key, shape, dt=torch.float32):  # fresh (its pages faulted in by every thread at once,
            # :func:`populate`), or the front of the caller's buffer of that role
            if work is None:
                return populate(fresh(shape, dtype=dt, device=device))
            n = math.prod(shape)
            t_ = work.get(key)
            if t_ is None or t_.numel() < n or t_.dtype != dt or t_.device != torch.device(device):
                t_ = work[key] = populate(fresh((n,), dtype=dt, device=device))
            return t_[:n].view(shape)

        # (batch rows, tokens a:e, result rows o0:o1) of each token block
        spans = [(slice(r, r + 1), a, e, r * t + a, r * t + e) for r in range(b) for a, e in blocks]

        def layer_block(k: int, g: int) -> int:  # one block: target layers per GEMM, GATHER_BYTES of features
            return max(1, min(g, GATHER_BYTES // (4 * rows * k * fs)))

        if len(blocks) == 1:
            most = max(
                layer_block(len(sel) // len(ls_), len(ls_)) * (len(sel) // len(ls_)) for ls_, sel, _, _ in groups["k"]
            )
            buf = alloc("gather", (rows * most * fs,))
        else:
            most = max(len(sel) // len(layers_) for layers_, sel, _, _ in groups["k"])
            buf = alloc("gather", (max(o1 - o0 for *_, o0, o1 in spans) * most * fs,))  # reused by every block
        out_k: list = [None] * len(self.layers)
        out_v: list = [None] * len(self.layers)
        for name, tensors, out in (("k", keys, out_k), ("v", values, out_v)):
            # [B, H_s, T, D_s] per source layer, read as [T, H_s, D_s] per batch row by the stacking copy
            src = [(x if x.dtype == torch.float32 else x.float()).transpose(1, 2) for x in tensors]
            results = [alloc((name, gi), (len(group[0]), rows, ht * dt)) for gi, group in enumerate(groups[name])]
            for (layers_, sel, w, bias), res in zip(groups[name], results) if len(blocks) == 1 else ():
                # one block of tokens: ONE stack and ONE baddbmm (bias fused) per block of whole target
                # layers (all rows), each writing a contiguous slice of `res` (few parallel regions)
                g, k = len(layers_), len(sel) // len(layers_)
                step = layer_block(k, g)
                for a in range(0, g, step):
                    e = min(g, a + step)
                    feats = buf[: rows * (e - a) * k * fs].view(b, t, (e - a) * k, hs, ds)
                    torch.stack([src[s] for s in sel[a * k : e * k]], dim=2, out=feats)
                    a_ = feats.view(rows, e - a, k * fs).transpose(0, 1)  # [block, rows, k·fs], strided
                    torch.baddbmm(bias[a:e], a_, w[a:e], out=res[a:e])
            for rs, a, e, o0, o1 in spans if len(blocks) > 1 else ():
                for (layers_, sel, w, bias), res in zip(groups[name], results):  # sel: G·k, w [G, k·fs, H_t·D_t]
                    k = len(sel) // len(layers_)
                    feats = buf[: (o1 - o0) * k * fs].view(-1, e - a, k, hs, ds)
                    for j in range(len(layers_)):
                        torch.stack([src[s][rs, a:e] for s in sel[j * k : (j + 1) * k]], dim=2, out=feats)
                        torch.addmm(bias[j], feats.view(o1 - o0, k * fs), w[j], out=res[j, o0:o1])
            for gi, ((layers_, _, _, _), res) in enumerate(zip(groups[name], results)):
                views = res.view(len(layers_), b, t, ht, dt).permute(0, 1, 3, 2, 4)  # [G, B, H_t, T, D_t]
                if dtype != torch.float32:  # one cast into the contiguous target layout
                    views = alloc((name, gi, "cast"), views.shape, dtype).copy_(views)
                for j, layer in enumerate(layers_):
                    out[layer] = views[j]
            del src, results  # a non-float32 source's float32 copy: one alive at a time
        return out_k, out_v

    def _dense_plan(self, device) -> dict:
        """Per K / V: groups of target layers with the same number of selected source layers, each
        ``(layers, sources (G·k ints), W [G, k·fs, H_t·D_t], bias [G, 1, H_t·D_t])`` on ``device``, cached."""
        cache = self.__dict__.setdefault("_dense_plans", {})
        key = (str(device), tuple(id(getattr(lm, n)) for lm in self.layers for n in ("wk", "bk", "wv", "bv")))
        if key not in cache:
            cache.clear()
            by_k: dict = {}
            for i, lm in enumerate(self.layers):
                by_k.setdefault(len(lm.sources), []).append(i)
            plan: dict = {"k": [], "v": []}
            for layers_ in by_k.values():
                sel = tuple(int(s) for i in layers_ for s in self.layers[i].sources)  # [G·k], target layer-major
                for name in ("k", "v"):
                    w = torch.stack([getattr(self.layers[i], "w" + name) for i in layers_]).to(device)
                    bias = torch.stack([getattr(self.layers[i], "b" + name) for i in layers_]).to(device)[:, None]
                    plan[name].append((tuple(layers_), sel, w.contiguous(), bias.contiguous()))
            cache[key] = plan
        return cache[key]

    def _plan(self, device) -> dict:
        """Per target layer of a headwise map ``(sources, W, bias [H_t, 1, D_t])`` on ``device``, cached."""
        cache = self.__dict__.setdefault("_plans", {})
        key = (str(device), tuple(id(getattr(lm, n)) for lm in self.layers for n in ("wk", "bk", "wv", "bv")))
        if key not in cache:
            cache.clear()
            ht, dt = self.target_spec.num_kv_heads, self.target_spec.head_dim
            plan: dict = {"k": [], "v": []}
            for lm in self.layers:
                lm = lm if lm.wk.device == torch.device(device) else lm.to(device=device)
                for name, w, bias in (("k", lm.wk, lm.bk), ("v", lm.wv, lm.bv)):
                    plan[name].append((lm.sources, w, bias.reshape(ht, 1, dt)))
            cache[key] = plan
        return cache[key]

    # -- serialisation --------------------------------------------------------------------------------
    def tensors(self) -> dict:
        names = ("wk", "bk", "wv", "bv")
        return {f"layers.{t}.{n}": getattr(lm, n).contiguous() for t, lm in enumerate(self.layers) for n in names}

    def layer_selection(self) -> list:
        return [[list(s) if isinstance(s, tuple) else s for s in lm.sources] for lm in self.layers]

    @classmethod
    def from_tensors(
        cls,
        tensors: dict,
        *,
        source_spec: ModelSpec,
        target_spec: ModelSpec,
        mode: str,
        selection: list,
        fitter: str,
        report: Any = None,
        manifest: dict | None = None,
    ) -> "FittedMapping":
        if mode not in MODES:
            raise ArtifactError(f"mapping mode {mode!r} is unknown", f"expected one of {MODES}")
        ls, hs, ds = geometry(source_spec)
        lt, ht, dt = geometry(target_spec)
        if len(selection) != lt:
            raise ArtifactError(
                f"layer_selection has {len(selection)} entries for {lt} target layers", "re-create the mapping"
            )
        layers = []
        for t in range(lt):
            try:
                w = {n: tensors[f"layers.{t}.{n}"] for n in ("wk", "bk", "wv", "bv")}
            except KeyError as exc:
                raise ArtifactError(f"mapping tensors lack {exc.args[0]!r}", "re-create the mapping") from None
            if mode == "dense":
                sources = tuple(int(s) for s in selection[t])
                want_w, want_b = (len(sources) * hs * ds, ht * dt), (ht * dt,)
            else:
                sources = tuple((int(a), int(b)) for a, b in selection[t])
                want_w, want_b = (ht, ds, dt), (ht, dt)
            bad = [s for s in sources if not (0 <= (s if mode == "dense" else s[0]) < ls)]
            if bad:
                raise ArtifactError(
                    f"target layer {t} selects source {bad[0]} outside {ls} source layers", "re-create the mapping"
                )
            for n, want in (("wk", want_w), ("wv", want_w), ("bk", want_b), ("bv", want_b)):
                if tuple(w[n].shape) != want:
                    raise ArtifactError(
                        f"tensor layers.{t}.{n} has shape {tuple(w[n].shape)}, expected {want}", "re-create the mapping"
                    )
            layers.append(LayerMap(mode, sources, w["wk"], w["bk"], w["wv"], w["bv"]))
        return cls(source_spec, target_spec, layers, fitter=fitter, report=report, manifest=manifest or {})

    def flops(self, tokens: int) -> int:
        """Multiply-add FLOPs (2 per MAC) of one ``map_tensors`` call for ``tokens`` tokens."""
        return sum(2 * 2 * tokens * lm.wk.numel() for lm in self.layers)

    def summary(self) -> dict[str, Any]:
        return {
            "fitter": self.fitter,
            "mode": self.mode,
            "layer_selection": self.layer_selection(),
            "parameters": sum(t.numel() for t in self.tensors().values()),
        }


__all__ = ["FittedMapping", "LayerMap", "geometry", "MODES"]
