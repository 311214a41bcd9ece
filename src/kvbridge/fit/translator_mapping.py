"""The ``translator`` mapping: a frozen ridge map plus a trained residual per target layer.

For target layer ``t`` and each of K and V, the residual reads the same features as the ridge
(the content K, or V, of the selected source layers, ``x [.., F]`` in ``[layer, head, dim]``
order), normalises them with fixed per-feature statistics of the training split
(``xn = (x - mu) * inv``) and adds, in the target's content space (before RoPE)::

    lowrank:  delta = xn @ A @ B                      A [F, r], B [r, H_t·D_t]
    mlp:      delta = gelu(xn @ W1 + b1) @ W2 + b2    W1 [F, h], W2 [h, H_t·D_t]

so the mapped content is ``ridge(x) + delta(x)``; the target's RoPE is applied after, as for
every mapping (:func:`kvbridge.transfer.transfer`). The residual tensors are stored beside the
ridge ones in ``mapping.safetensors`` as ``residual.<t>.<k|v>.<name>``; the manifest's
``residual`` field names the kind and its size, and :func:`kvbridge.fit.artifact.load_mapping`
rebuilds a :class:`TranslatorMapping` from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvbridge.errors import ArtifactError
from kvbridge.fit.mapping import FittedMapping

KINDS = ("lowrank", "mlp")
#: the trained tensors of each kind (the normalisation ``mu`` / ``inv`` is fixed, not trained)
TRAINED = {"lowrank": ("a", "b"), "mlp": ("w1", "b1", "w2", "b2")}
FIXED = ("mu", "inv")
PREFIX = "residual"
#: the manifest ``mode`` of a translator mapping (its layers are ``dense``)
RESIDUAL_MODE = "dense+residual"


def tensor_name(layer: int, kind: str, name: str) -> str:
    return f"{PREFIX}.{layer}.{kind}.{name}"


def stacked_delta(x: torch.Tensor, params: dict, kind: str) -> torch.Tensor:
    """Every layer's residual at once: ``x [B, L, T, F]`` (normalised) -> ``[B, L, T, O]``;
    ``params`` stacked over layers (lowrank ``a [L, F, r]``, ``b [L, r, O]``; mlp ``w1 [L, F, h]``,
    ``b1 [L, h]``, ``w2 [L, h, O]``, ``b2 [L, O]``)."""
    if kind == "lowrank":
        return (x @ params["a"]) @ params["b"]
    hidden = torch.nn.functional.gelu(x @ params["w1"] + params["b1"][:, None])
    return hidden @ params["w2"] + params["b2"][:, None]


def features(layers: list, maps: list) -> torch.Tensor:
    """``[B, L, T, k·fs]``: the content K (or V) each target layer's map in ``maps`` reads, from the
    source's per-layer ``layers`` (``[B, H_s, T, D_s]`` each), in ``[layer, head, dim]`` order."""
    index = torch.tensor([[int(s) for s in lm.sources] for lm in maps], device=layers[0].device)  # [L, k]
    stacked = torch.stack([x.float().transpose(1, 2).flatten(2) for x in layers], 1)  # [B, Ls, T, fs]
    return stacked[:, index].permute(0, 1, 3, 2, 4).flatten(3)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, interleaved: bool) -> torch.Tensor:
    """``x [B, H, T, D]`` rotated on its first ``rotary_dim`` dims by tables ``cos``/``sin``
    ``[B, T, rotary_dim]`` (:func:`kvbridge.rope.tables`, the model's layout and scaling); pure
    torch operations, so gradients flow (the residual's keys during training)."""
    c, s = cos[:, None], sin[:, None]
    head, tail = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        pairs = head.reshape(*head.shape[:-1], rotary_dim // 2, 2)
        turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).reshape(head.shape)
    else:
        half = rotary_dim // 2
        turned = torch.cat((-head[..., half:], head[..., :half]), dim=-1)
    out = head * c + turned * s
    return torch.cat((out, tail), dim=-1) if tail.shape[-1] else out


@dataclass
class TranslatorMapping(FittedMapping):
    """A dense ridge mapping plus a residual per target layer (see the module docstring)."""

    residual: dict = field(default_factory=dict)  # tensor name -> tensor (residual.<t>.<k|v>.<name>)
    residual_kind: str = "lowrank"
    residual_size: int = 0  # rank (lowrank) or hidden units (mlp)

    def __post_init__(self):
        super().__post_init__()
        if self.residual_kind not in KINDS:
            raise ArtifactError(f"residual kind {self.residual_kind!r} is unknown", f"expected one of {KINDS}")
        if self.mode != "dense":
            raise ArtifactError("a translator residual needs a dense ridge mapping", "re-create the mapping")
        self.residual = {k: v.detach().to(torch.float32).contiguous() for k, v in self.residual.items()}
        want = [
            tensor_name(t, c, n)
            for t in range(len(self.layers))
            for c in ("k", "v")
            for n in FIXED + TRAINED[self.residual_kind]
        ]
        missing = [n for n in want if n not in self.residual]
        if missing:
            raise ArtifactError(f"mapping tensors lack {missing[0]!r}", "re-create the mapping (kvbridge fit)")

    def layer_params(self, layer: int, kind: str) -> dict:
        names = FIXED + TRAINED[self.residual_kind]
        return {n: self.residual[tensor_name(layer, kind, n)] for n in names}

    def stacked(self, device=None) -> dict:
        """Per K / V: the residual's tensors stacked over target layers (``[L, ...]``), cached."""
        cache = self.__dict__.setdefault("_stacked", {})
        key = str(device)
        if key not in cache:
            per = {c: [self.layer_params(t, c) for t in range(len(self.layers))] for c in ("k", "v")}
            cache[key] = {c: {n: torch.stack([p[n] for p in ps]).to(device) for n in ps[0]} for c, ps in per.items()}
        return cache[key]

    def map_tensors(self, keys, values, *, dtype=torch.float32) -> tuple[list, list]:
        """The ridge map (float32), plus every layer's residual (one batched product), cast to ``dtype``."""
        out_k, out_v = super().map_tensors(keys, values, dtype=torch.float32)
        b, _, t, _ = keys[0].shape
        ht, dt = self.target_spec.num_kv_heads, self.target_spec.head_dim
        params = self.stacked(keys[0].device)
        for kind, src, out in (("k", keys, out_k), ("v", values, out_v)):
            x = features(src, self.layers)  # [B, L, T, k·fs]
            p = params[kind]
            x = (x - p["mu"][:, None]) * p["inv"][:, None]
            delta = stacked_delta(x, p, self.residual_kind).view(b, len(self.layers), t, ht, dt).transpose(2, 3)
            for layer in range(len(self.layers)):
                out[layer] = (out[layer] + delta[:, layer]).to(dtype)
        return out_k, out_v

    def tensors(self) -> dict:
        return {**super().tensors(), **self.residual}

    def manifest_fields(self) -> dict:
        """Fields :func:`kvbridge.fit.artifact.build_manifest` adds to the manifest."""
        # the manifest's mode says "residual" too: a kvbridge without the translator refuses the mapping
        # (an unknown mode) rather than loading its ridge part as if it were the whole map
        return {
            "mode": RESIDUAL_MODE,
            "residual": {"kind": self.residual_kind, "size": int(self.residual_size), "space": "content"},
        }

    def flops(self, tokens: int) -> int:
        extra = sum(
            2 * tokens * v.numel() for k, v in self.residual.items() if k.rsplit(".", 1)[1] in ("a", "b", "w1", "w2")
        )
        return super().flops(tokens) + extra


def with_residual(mapping: FittedMapping, tensors: dict, record: dict) -> TranslatorMapping:
    """A loaded ridge mapping and its artifact's residual tensors (manifest field ``residual``)."""
    if not isinstance(record, dict) or record.get("kind") not in KINDS:
        raise ArtifactError(
            f"manifest field residual.kind must be one of {KINDS}, got {record!r}", "re-create the mapping"
        )
    residual = {k: v for k, v in tensors.items() if k.startswith(PREFIX + ".")}
    return TranslatorMapping(
        mapping.source_spec,
        mapping.target_spec,
        mapping.layers,
        fitter=mapping.fitter,
        report=mapping.report,
        manifest=mapping.manifest,
        residual=residual,
        residual_kind=record["kind"],
        residual_size=int(record.get("size") or 0),
    )
