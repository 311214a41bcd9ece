"""Steering vectors: per layer and KV head, a K and a V direction (and a residual direction).

:func:`build_vector` prefills both sides of every contrastive pair (:mod:`kvbridge.steer.pairs`)
once, reads the cache at the chosen positions and takes, per layer and KV head, the mean of the
positive-minus-negative differences (``method="mean"``, as in KV cache steering), or the first
principal component of the differences (``method="pca"``: centred, sign-aligned with the mean
difference and scaled by the mean projection on it, so its norm is comparable to the mean's).
The same forward passes give the residual-stream direction after every decoder layer (the
activation-addition baseline built from the same pairs and positions).

**Keys live in content space.** A cached key at position ``p`` is ``R(p) k`` (RoPE), so keys of
pairs read at different positions are rotated differently: averaging them averages rotations
and blurs the direction. The builder strips RoPE first (``state.strip_rope()``) and the editor
rotates the direction to each target position (``R(p)(k + d) = R(p)k + R(p)d``, RoPE is linear),
which is right at *any* position: the attention score ``q_t · R(p)d`` then sees ``d`` exactly as
it would see a key of that content at ``p``. ``key_space="rotated"`` keeps the raw rotated keys
(what the paper's implementation does): correct only where the vector is applied at the very
position it was read at, so it is kept for comparison and refused by cross-model transfer.
Values carry no rotation.

:func:`random_like` gives the control: per layer and head a random direction with the same norm
as the vector's. :func:`transfer_vector` moves a vector to another model through a fitted
mapping: content state ``[0, d]`` mapped, difference taken (an affine map's bias cancels:
``f(d) - f(0) = W d``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from kvbridge.errors import KVBridgeError

METHODS = ("mean", "pca")
KEY_SPACES = ("content", "rotated")


class SteerError(KVBridgeError):
    """A steering vector cannot be built, applied or moved as asked."""


@dataclass(frozen=True)
class SteeringVector:
    """Directions per layer: ``keys[i]`` / ``values[i]`` ``[kv_heads, head_dim]`` float32, ``residual[i]``
    ``[hidden]`` float32 (empty tuple when the vector has none, e.g. after a cross-model transfer)."""

    keys: tuple
    values: tuple
    residual: tuple
    spec: Any  # ModelSpec of the model the directions belong to
    key_space: str = "content"
    info: dict = field(default_factory=dict, compare=False)  # build record (manifest fields)

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def norms(self) -> dict:
        """Per layer: the K and V norm of each KV head, the residual norm."""
        return {
            "keys": [[round(float(h.norm()), 6) for h in k] for k in self.keys],
            "values": [[round(float(h.norm()), 6) for h in v] for v in self.values],
            "residual": [round(float(r.norm()), 6) for r in self.residual],
        }

    def validate(self) -> "SteeringVector":
        for name, group in (("keys", self.keys), ("values", self.values), ("residual", self.residual)):
            for i, t in enumerate(group):
                if not bool(torch.isfinite(t).all()):
                    raise SteerError(
                        f"steering vector {name} of layer {i} has NaN/inf values",
                        "rebuild the vector (kvbridge steer build)",
                    )
        return self


def _side_state(adapter, model, spec, enc, capture, key_space: str):
    ids = torch.tensor([list(enc.ids)], device=next(model.parameters()).device)
    capture.window = (enc.start, enc.stop)
    state = adapter.extract(model, ids, spec=spec)
    if state.states:
        raise SteerError(
            f"{spec.model_type!r} keeps recurrent state besides K/V", "KV steering supports attention caches"
        )
    if key_space == "content":
        state = state.strip_rope(dtype=torch.float32)
    a, b = enc.start, enc.stop
    keys = [k[0, :, a:b].float().mean(1) for k in state.keys]
    values = [v[0, :, a:b].float().mean(1) for v in state.values]
    resid = [capture.captured[i][0].mean(0) for i in range(spec.num_layers)]
    return keys, values, resid


def _pca(diffs):
    """First principal direction of ``diffs [P, ...]`` (centred), sign-aligned with the mean and
    scaled by the mean projection on it."""
    flat = diffs.reshape(diffs.shape[0], -1).double()
    mean = flat.mean(0)
    centred = flat - mean
    if float(centred.abs().max()) == 0.0:
        return mean.to(torch.float32).reshape(diffs.shape[1:])
    _u, _s, vh = torch.linalg.svd(centred, full_matrices=False)
    u = vh[0]
    if float(u @ mean) < 0:
        u = -u
    scale = float((flat @ u).mean())
    return (u * scale).to(torch.float32).reshape(diffs.shape[1:])


def _combine(diffs, method: str):
    """``diffs [P, ...]`` -> one direction per (layer, head): the mean, or PCA per head row."""
    if method == "mean":
        return diffs.double().mean(0).to(torch.float32)
    if diffs.dim() == 3:  # [P, H, D]: one component per KV head
        return torch.stack([_pca(diffs[:, h]) for h in range(diffs.shape[1])])
    return _pca(diffs)


def build_vector(
    model,
    tokenizer,
    pairs,
    *,
    position: str = "last",
    method: str = "mean",
    key_space: str = "content",
    host=None,
    progress: Callable[[int, int], None] | None = None,
) -> SteeringVector:
    """A :class:`SteeringVector` from contrastive ``pairs`` (see the module docstring)."""
    from kvbridge.check.validate import one_of
    from kvbridge.plugins import adapter_of
    from kvbridge.steer.hooks import ResidualCapture
    from kvbridge.steer.pairs import encode_side, pairs_digest, template_kind

    one_of(method, METHODS, "--method")
    one_of(key_space, KEY_SPACES, "--key-space")
    if not pairs:
        raise SteerError("no contrastive pairs", "pass a pairs file with at least one pair")
    if method == "pca" and len(pairs) < 2:
        raise SteerError("--method pca needs at least 2 pairs", "add pairs or use --method mean")
    adapter = adapter_of(model, host)
    spec = adapter.spec_of(model)
    if spec.cache_format != "kv":
        raise SteerError(
            f"{spec.model_type!r} caches {spec.cache_format!r} tensors, not per-head K/V",
            "KV steering supports ordinary K/V caches",
        )
    limit = int(spec.max_position_embeddings or 0)
    encoded = []
    for p in pairs:  # encode everything first: a bad pair fails before any forward pass
        sides = []
        for name, side in (("positive", p.positive), ("negative", p.negative)):
            enc = encode_side(tokenizer, side, position, f"pair on line {p.line} ({name})")
            if limit and len(enc.ids) > limit:
                raise SteerError(
                    f"pair on line {p.line} ({name}) has {len(enc.ids)} tokens, the model has {limit} positions",
                    "shorten the pair",
                )
            sides.append(enc)
        encoded.append(sides)
    capture = ResidualCapture(model)
    dk, dv, dr = ([[] for _ in range(spec.num_layers)] for _ in range(3))
    try:
        with torch.no_grad():
            for n, (pos, neg) in enumerate(encoded):
                kp, vp, rp = _side_state(adapter, model, spec, pos, capture, key_space)
                kn, vn, rn = _side_state(adapter, model, spec, neg, capture, key_space)
                for i in range(spec.num_layers):
                    dk[i].append(kp[i] - kn[i])
                    dv[i].append(vp[i] - vn[i])
                    dr[i].append(rp[i] - rn[i])
                if progress is not None:
                    progress(n + 1, len(encoded))
    finally:
        capture.remove()
    keys, values, resid = (tuple(_combine(torch.stack(d), method).cpu() for d in ds) for ds in (dk, dv, dr))
    info = {
        "method": method,
        "position": position,
        "key_space": key_space,
        "num_pairs": len(pairs),
        "pairs_sha256": pairs_digest(pairs),
        "template": template_kind(tokenizer, pairs),
        "tokens_read": [[e.stop - e.start for e in sides] for sides in encoded][:8],
    }
    return SteeringVector(keys, values, resid, spec, key_space, info).validate()


def random_like(vector: SteeringVector, seed: int = 0) -> SteeringVector:
    """Random directions with the vector's norm per layer and KV head (K and V) and per layer
    (residual): the control arm. Deterministic in ``seed``."""
    g = torch.Generator().manual_seed(int(seed))

    def like(t):  # a 1-D residual direction: one norm; K/V [heads, dim]: one per head
        r = torch.randn(t.shape, generator=g, dtype=torch.float64)
        per = {} if t.dim() == 1 else {"dim": -1, "keepdim": True}
        return (r / r.norm(**per) * t.double().norm(**per)).to(torch.float32)

    info = {**vector.info, "method": f"random(seed={seed}) like {vector.info.get('method', '?')}"}
    groups = {name: tuple(like(t) for t in getattr(vector, name)) for name in ("keys", "values", "residual")}
    return replace(vector, **groups, info=info)


def transfer_vector(vector: SteeringVector, mapping, target_spec=None) -> SteeringVector:
    """The vector moved through a fitted mapping (strip, map, re-apply as for a cache): per target
    layer ``f([d]) - f([0])``, the mapping's linear part applied to the content directions."""
    from kvbridge.kvstate import KVState

    if vector.key_space != "content":
        raise SteerError(
            "a vector built on rotated keys cannot be moved to another model: its keys carry the "
            "source positions' rotation",
            "rebuild it with --key-space content",
        )
    target_spec = target_spec or mapping.target_spec
    src = vector.spec
    keys = tuple(torch.stack([torch.zeros_like(k), k], dim=1)[None] for k in vector.keys)  # [1, H, 2, D]
    values = tuple(torch.stack([torch.zeros_like(v), v], dim=1)[None] for v in vector.values)
    ids = torch.zeros(1, 2, dtype=torch.long)
    state = KVState(
        keys=keys, values=values, token_ids=ids, positions=torch.arange(2)[None], spec=src, rope_applied=False
    )
    mapped = mapping.map_content(state, target_spec)
    tk = tuple((k[0, :, 1].float() - k[0, :, 0].float()).cpu() for k in mapped.keys)
    tv = tuple((v[0, :, 1].float() - v[0, :, 0].float()).cpu() for v in mapped.values)
    info = {
        **vector.info,
        "method": f"transferred({vector.info.get('method', '?')})",
        "transferred_from": {
            "model_type": src.model_type,
            "spec_fingerprint": src.fingerprint(),
            "mapping": getattr(mapping, "name", type(mapping).__name__),
            "source_model": dict(vector.info.get("model", {})),
        },
    }
    info.pop("model", None)
    return SteeringVector(tk, tv, (), target_spec, "content", info).validate()
