"""Apply a mapping to a KV state: strip source RoPE -> map content -> apply target RoPE.

A *mapping* is any object with ``map_content(state, target_spec) -> KVState`` that takes a
content-space state (keys with RoPE stripped) of the source geometry and returns a
content-space state of the target geometry, and an ``exact`` flag. The identity mapping is
here (:class:`IdentityMapping`, which the built-in ``identity`` fitter returns); fitted
mappings come from fitter plugins.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvbridge.errors import StateError
from kvbridge.spec import ModelSpec

if TYPE_CHECKING:  # pragma: no cover
    from kvbridge.kvstate import KVState


#: a long transfer through a per-token mapping (``mapping.per_token``, the fitted mappings; more than
#: :data:`BLOCKS_ABOVE` tokens) runs in blocks of this many tokens: each block's RoPE strip, map and re-application
#: written straight into the target cache, the map's buffers reused from block to block, so the
#: float32 stripped keys and the mapped K/V of the whole cache never exist (at 32,768 tokens on
#: Qwen2.5 0.5B -> 1.5B: 0.375 + 1.75 GiB; BENCHMARKS.md, "Issue 35: 32,768 tokens"). The blocks
#: are :func:`kvbridge.buffers.token_blocks` (a short remainder joins the last block): every
#: token's result is bitwise the one-pass result (tests/test_transfer_blocks.py; the real pair's
#: 32,768-token cache, BENCHMARKS.md).
CHUNK_TOKENS = 1024
#: ... for a cache of more than this many tokens; up to it one pass (faster: no copy of the mapped
#: values into the target cache, the map's own token blocks; its memory is small there)
BLOCKS_ABOVE = 8192


def content_geometry(spec) -> tuple:
    """``(layers, KV heads, head dim)``: what must match for a copy to be a valid mapping."""
    return (spec.num_layers, spec.num_kv_heads, spec.head_dim)


@dataclass(frozen=True)
class IdentityMapping:
    """Copies content-space K/V; only valid when layers, KV heads and head dim all match."""

    exact: bool = True
    name: str = "identity"
    identity: bool = True

    def check_pair(self, source_spec, target_spec) -> None:
        if content_geometry(source_spec) != content_geometry(target_spec):
            raise StateError(
                f"identity mapping needs the same content geometry; source (layers, kv_heads, head_dim)="
                f"{content_geometry(source_spec)}, target={content_geometry(target_spec)}",
                "fit a mapping with `kvbridge fit` (e.g. --fitter ridge)",
            )

    def map_content(self, state, target_spec):
        self.check_pair(state.spec, target_spec)
        return replace(state.map_tensors(lambda t: t.clone()), spec=target_spec, rope_applied=False, rope_lengths=None)


def work_dtype(dtype):
    """The dtype content-space work runs in: float32 for a half-precision cache, else its own."""
    import torch

    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def same_rotation(source, target) -> bool:
    """Whether ``target`` rotates every cached key exactly as ``source`` does at the same position
    (same positional scheme and, layer by layer, the same RoPE table; the same indexer RoPE)."""
    if source.positional != target.positional or source.num_layers != target.num_layers:
        return False
    if source.positional != "rope":
        return True
    return (
        all(source.rope_for_layer(i) == target.rope_for_layer(i) for i in range(source.num_layers))
        and all(source.indexer_rope_for_layer(i) == target.indexer_rope_for_layer(i) for i in source.indexer_layers)
        and tuple(source.indexer_layers) == tuple(target.indexer_layers)
    )


def transfer(
    state: "KVState", mapping: Any, target_spec: ModelSpec | None = None, *, target_positions=None, host=None
) -> "KVState":
    """A target-geometry cache (RoPE applied for the target) from a source state.

    ``target_spec`` defaults to the mapping's own ``target_spec`` (fitted mappings carry it).

    - An identity mapping (``mapping.identity``) onto a target that rotates keys as the source does
      never leaves the cache's numbers: at the same positions the keys come back bit for bit (a
      copy), at other positions they take one rotation by the difference (:meth:`KVState.reposition`).
    - Everything else strips the source RoPE, maps the content and applies the target's RoPE, in
      float32 for a half-precision cache, rounding once to the target dtype at the end.
    """
    import torch

    target_spec = target_spec or getattr(mapping, "target_spec", None) or state.spec
    if state.spec.positional not in ("rope", "none") and state.spec.positional != target_spec.positional:
        raise StateError(
            f"source {state.spec.model_type!r} uses {state.spec.positional} positions: they are baked into "
            "its cached keys and cannot be stripped",
            "transfer between models of the same positional scheme",
        )
    positions = state.positions if target_positions is None else target_positions
    exact = getattr(mapping, "exact", False)
    if getattr(mapping, "identity", False) and state.rope_applied and same_rotation(state.spec, target_spec):
        positions = torch.as_tensor(positions).to(state.positions.device).expand(state.batch_size, -1)
        moved = not torch.equal(positions, state.positions)
        if not moved or state.spec.positional in ("rope", "none"):
            mapping.check_pair(state.spec, target_spec)
            out = replace(state.clone(), spec=target_spec)
            return replace(out.reposition(positions, host=host) if moved else out, approximate=state.approximate)
    final = state.dtype if exact else getattr(torch, target_spec.dtype, state.dtype)
    if getattr(mapping, "per_token", False) and state.num_tokens > max(BLOCKS_ABOVE, CHUNK_TOKENS) and not state.states:
        out = _transfer_blocks(state, mapping, target_spec, positions, final, host)
        return replace(out, approximate=state.approximate or not exact)
    # the stripped float32 copy is a temporary: not held during the re-application (peak memory)
    mapped = mapping.map_content(state.strip_rope(host=host, dtype=work_dtype(state.dtype)), target_spec)
    if mapped.rope_applied:
        raise StateError("mapping returned keys marked as carrying RoPE", "return content-space keys")
    out = mapped.apply_rope(positions, spec=target_spec, host=host, dtype=final)
    return replace(out, approximate=state.approximate or not exact)


def _transfer_blocks(state: "KVState", mapping: Any, target_spec: ModelSpec, positions, final, host) -> "KVState":
    """:func:`transfer`'s strip -> map -> re-apply, :data:`CHUNK_TOKENS` tokens at a time, into one
    target cache allocated once. RoPE tables see the whole cache's forward lengths (a stateful
    RoPE picks its table by them), so each block rotates exactly as the one pass would. The target
    cache is populated when allocated (:func:`kvbridge.buffers.populate`: at two threads or more its
    first touch is split over the threads, instead of falling on the copies of each block; at 32,768
    tokens and two threads 3.60 -> 3.39 s, a first call 4.51 -> 4.29 s, same bits: BENCHMARKS.md
    "5. Where the 32K transfer's time goes")."""
    import torch

    from kvbridge import rope
    from kvbridge.buffers import fresh, populate, token_blocks

    n, b = state.num_tokens, state.batch_size
    positions = torch.as_tensor(positions).to(state.token_ids.device).expand(b, -1)
    if state.rope_applied and state.spec.positional == "rope" and state.rope_lengths is None:
        # what strip_rope uses for a stateful RoPE when none are given: the whole cache's
        state = replace(state, rope_lengths=rope.forward_lengths(state.positions))
    lengths = rope.forward_lengths(positions) if target_spec.positional == "rope" else None
    stateful = target_spec.rope is not None and target_spec.rope.is_stateful
    work: dict = {}  # the map's gather buffer and results, reused by every block
    first, out_k, out_v = None, [], []
    for a, e in token_blocks(n, CHUNK_TOKENS):
        content = state.slice_tokens(a, e).strip_rope(host=host, dtype=work_dtype(state.dtype))
        mapped = mapping.map_content(content, target_spec, work=work)
        del content
        if mapped.rope_applied:
            raise StateError("mapping returned keys marked as carrying RoPE", "return content-space keys")
        part = mapped.apply_rope(
            positions[:, a:e],
            spec=target_spec,
            rope_lengths=None if lengths is None else lengths[:, a:e],
            host=host,
            dtype=final,
        )
        del mapped
        if first is None:
            first = part
            for ts, out in ((part.keys, out_k), (part.values, out_v)):
                out.extend(populate(fresh((*t.shape[:2], n, *t.shape[3:]), dtype=t.dtype, device=t.device)) for t in ts)
        for ts, out in ((part.keys, out_k), (part.values, out_v)):
            for o, t in zip(out, ts):
                o[:, :, a:e].copy_(t)
        del part
    return replace(
        first,
        keys=tuple(out_k),
        values=tuple(out_v),
        token_ids=state.token_ids,
        positions=positions,
        rope_lengths=lengths if stateful else None,
    )


def identity_transfer(
    state: "KVState", target_spec: ModelSpec | None = None, *, target_positions=None, host=None
) -> "KVState":
    """Same-model transfer (the built-in exact baseline): bit for bit at the same positions."""
    return transfer(state, IdentityMapping(), target_spec or state.spec, target_positions=target_positions, host=host)
