"""The fitted mapping: per target (layer, KV head) affine maps of source content K and V.

A :class:`FittedMapping` is what :func:`kvbridge.transfer.transfer` calls: ``map_content``
takes a content-space source state (RoPE stripped) and returns a content-space target state.
Two layouts:

- ``dense`` (``ridge``, ``sklearn``): target layer t reads the KV heads of its selected source
  layers ``S(t)`` (best first); ``W [F, H_t·D_t]`` with ``F = |S(t)|·H_s·D_s`` (features in
  ``[layer, head, dim]`` order), ``b [H_t·D_t]``: ``y = x W + b`` for every token;
- ``headwise`` (``ridge-headwise``): target head h of layer t reads one source head
  ``(layer, head)``; ``W [H_t, D_s, D_t]``, ``b [H_t, D_t]``.

Compute is float32 and batched: the source cache is laid out once as ``[B·T, L_s, H_s·D_s]``;
for each target layer the selected layers' features are gathered (one ``index_select``
into a reused buffer) and multiplied by ``W`` in one GEMM with the bias fused
(``addmm``), and the result is cast to the target dtype. A fitted mapping is
approximate by nature: ``exact`` is False, so transferred states are marked ``approximate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kvbridge.errors import ArtifactError, StateError
from kvbridge.check.spec import ModelSpec

MODES = ("dense", "headwise")


def geometry(spec: ModelSpec) -> tuple:
    return (spec.num_layers, spec.num_kv_heads, spec.head_dim)


@dataclass
class LayerMap:
    """The maps of one target layer (K and V)."""

    mode: str
    sources: tuple  # dense: source layers; headwise: ((layer, head), ...) per target head
    wk: torch.Tensor
    bk: torch.Tensor
    wv: torch.Tensor
    bv: torch.Tensor

    def source_index(self, device=None) -> torch.Tensor:
        """The selected source layers as an index tensor (dense layout), cached per device."""
        cache = self.__dict__.setdefault("_index", {})
        key = str(device)
        if key not in cache:
            cache[key] = torch.tensor([int(s) for s in self.sources], dtype=torch.long, device=device)
        return cache[key]

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
            raise StateError(f"mapping has {len(self.layers)} target layers, target spec has {self.target_spec.num_layers}",
                             "fit the mapping for this target")
        self.layers = [lm.to(torch.float32) for lm in self.layers]

    # -- the transfer step --------------------------------------------------------------------------
    def check_pair(self, source_spec: ModelSpec, target_spec: ModelSpec) -> None:
        for role, want, got in (("source", self.source_spec, source_spec), ("target", self.target_spec, target_spec)):
            if geometry(want) != geometry(got):
                raise StateError(
                    f"mapping expects a {role} with (layers, kv_heads, head_dim)={geometry(want)}, got {geometry(got)}",
                    f"use a mapping fitted for this {role} model (kvbridge fit)")

    def map_content(self, state, target_spec: ModelSpec | None = None):
        """Content-space source state -> content-space target state (target dtype)."""
        from kvbridge.kvstate import KVState

        target_spec = target_spec or self.target_spec
        if state.rope_applied and state.spec.positional == "rope":
            raise StateError("map_content needs content-space keys (RoPE stripped)", "call state.strip_rope() first")
        self.check_pair(state.spec, target_spec)
        dtype = getattr(torch, target_spec.dtype, torch.float32)
        keys, values = self.map_tensors(state.keys, state.values, dtype=dtype)
        return KVState(keys=tuple(keys), values=tuple(values), token_ids=state.token_ids, positions=state.positions,
                       spec=target_spec, rope_applied=False, rope_lengths=None,
                       model_fingerprint="", approximate=True, meta=dict(state.meta))

    def map_tensors(self, keys, values, *, dtype=torch.float32) -> tuple[list, list]:
        """Per-layer source content ``keys``/``values`` ``[B, H_s, T, D_s]`` -> target lists."""
        src = self.source_spec
        ls, hs, ds = geometry(src)
        b, _, t, _ = keys[0].shape
        n = b * t
        device = keys[0].device
        feats = {}
        for name, tensors in (("k", keys), ("v", values)):
            x = torch.empty(b, t, ls, hs, ds, dtype=torch.float32, device=device)
            for i, layer in enumerate(tensors):
                x[:, :, i].copy_(layer.transpose(1, 2))
            feats[name] = x.view(n, ls * hs * ds)
        ht, dt = self.target_spec.num_kv_heads, self.target_spec.head_dim
        out_k, out_v = [], []
        bufs: dict = {}
        for lm in self.layers:
            lm = lm if lm.wk.device == device else lm.to(device=device)
            for name, w, bias, out in (("k", lm.wk, lm.bk, out_k), ("v", lm.wv, lm.bv, out_v)):
                x = feats[name]
                if lm.mode == "dense":
                    if len(lm.sources) == 1:
                        s0 = lm.sources[0]
                        xs = x[:, s0 * hs * ds:(s0 + 1) * hs * ds]
                    else:  # gather the selected layers' features: one GEMM with K = k * H_s * D_s
                        key = (len(lm.sources), name)
                        buf = bufs.get(key)
                        if buf is None:
                            buf = bufs[key] = torch.empty(n, len(lm.sources), hs * ds, dtype=torch.float32,
                                                          device=device)
                        torch.index_select(x.view(n, ls, hs * ds), 1, lm.source_index(device), out=buf)
                        xs = buf.view(n, -1)
                    y = torch.addmm(bias, xs, w).view(b, t, ht, dt).transpose(1, 2)
                else:
                    idx = torch.tensor([l * hs + h for l, h in lm.sources], device=device)
                    xh = x.view(n, ls * hs, ds).index_select(1, idx).transpose(0, 1)  # [H_t, n, D_s]
                    y = torch.baddbmm(bias[:, None, :], xh, w).view(ht, b, t, dt).transpose(0, 1)
                # one copy into the target layout [B, H_t, T, D_t], cast to the target dtype on the way
                out.append(torch.empty(b, ht, t, dt, dtype=dtype, device=device).copy_(y))
        return out_k, out_v

    # -- serialisation --------------------------------------------------------------------------------
    def tensors(self) -> dict:
        out = {}
        for t, lm in enumerate(self.layers):
            for name in ("wk", "bk", "wv", "bv"):
                out[f"layers.{t}.{name}"] = getattr(lm, name).contiguous()
        return out

    def layer_selection(self) -> list:
        return [[list(s) if isinstance(s, tuple) else s for s in lm.sources] for lm in self.layers]

    @classmethod
    def from_tensors(cls, tensors: dict, *, source_spec: ModelSpec, target_spec: ModelSpec, mode: str,
                     selection: list, fitter: str, report: Any = None,
                     manifest: dict | None = None) -> "FittedMapping":
        if mode not in MODES:
            raise ArtifactError(f"mapping mode {mode!r} is unknown", f"expected one of {MODES}")
        ls, hs, ds = geometry(source_spec)
        lt, ht, dt = geometry(target_spec)
        if len(selection) != lt:
            raise ArtifactError(f"layer_selection has {len(selection)} entries for {lt} target layers",
                                "re-create the mapping")
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
                raise ArtifactError(f"target layer {t} selects source {bad[0]} outside {ls} source layers",
                                    "re-create the mapping")
            for n, want in (("wk", want_w), ("wv", want_w), ("bk", want_b), ("bv", want_b)):
                if tuple(w[n].shape) != want:
                    raise ArtifactError(f"tensor layers.{t}.{n} has shape {tuple(w[n].shape)}, expected {want}",
                                        "re-create the mapping")
            layers.append(LayerMap(mode, sources, w["wk"], w["bk"], w["wv"], w["bv"]))
        return cls(source_spec, target_spec, layers, fitter=fitter, report=report, manifest=manifest or {})

    def flops(self, tokens: int) -> int:
        """Multiply-add FLOPs (2 per MAC) of one ``map_tensors`` call for ``tokens`` tokens."""
        total = 0
        for lm in self.layers:
            total += 2 * 2 * tokens * lm.wk.numel()
        return total

    def summary(self) -> dict[str, Any]:
        return {"fitter": self.fitter, "mode": self.mode, "layer_selection": self.layer_selection(),
                "parameters": sum(t.numel() for t in self.tensors().values())}


__all__ = ["FittedMapping", "LayerMap", "geometry", "MODES"]
