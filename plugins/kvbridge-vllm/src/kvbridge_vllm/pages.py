"""Reading vLLM's paged cache back, without knowing its layout.

vLLM's attention backends lay a block out as their kernels want it (the CPU kernel stores each
(block, head) page as K transposed then V; other kernels differ). Writing goes through the
backend's own cache-write op, so the layout stays vLLM's business; to read pages back (saving
vLLM's own prefill), :func:`learn_layout` writes numbered probes through that same op into a
scratch block and records where each (token, head, dim, K/V) element landed. The probe numbers
are written in base-64 digits (exact in float32, bfloat16 and float16), one pass per digit.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

DIGIT_BITS = 6


def learn_layout(
    write: Callable, block_shape: tuple, dtype: torch.dtype, block_size: int, num_heads: int, head_size: int
) -> torch.Tensor:
    """``pos`` of shape ``[block_size, num_heads, head_size, 2]``: the flat offset inside one block
    of each token slot's K (``[..., 0]``) and V (``[..., 1]``) element. ``write(key, value, cache,
    slot_mapping)`` is the backend's cache write; ``block_shape`` one block's shape in the paged
    tensor. Raises ``ValueError`` when the op does not place every element exactly once."""
    n = block_size * num_heads * head_size * 2
    passes = max(1, math.ceil(math.log2(n) / DIGIT_BITS))
    src = torch.arange(n, dtype=torch.long).reshape(block_size, num_heads, head_size, 2)
    slots = torch.arange(block_size, dtype=torch.long)
    found = None
    for p in range(passes):
        digit = ((src >> (DIGIT_BITS * p)) & ((1 << DIGIT_BITS) - 1)) + 1  # 1..64: 0 marks "not written"
        scratch = torch.zeros((1, *block_shape), dtype=dtype)
        write(digit[..., 0].to(dtype).contiguous(), digit[..., 1].to(dtype).contiguous(), scratch, slots)
        got = scratch.reshape(-1).to(torch.float32).round().to(torch.long)
        if found is None:
            found = torch.zeros_like(got)
            written = got > 0
        elif not bool(((got > 0) == written).all()):
            raise ValueError("the cache-write op wrote different offsets on two probes")
        found += (got - 1).clamp(min=0) << (DIGIT_BITS * p)
    offsets = written.nonzero().reshape(-1)
    values = found[offsets]
    if offsets.numel() != n or not torch.equal(values.sort().values, torch.arange(n)):
        raise ValueError(f"the cache-write op placed {offsets.numel()} of {n} probe elements, not each once")
    pos = torch.empty(n, dtype=torch.long)
    pos[values] = offsets
    return pos.reshape(block_size, num_heads, head_size, 2)


def read_slots(cache: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, block_size: int):
    """``(keys, values)``, each ``[len(slots), heads, head_size]``: the elements of ``slots`` in the
    paged ``cache`` (``[num_blocks, ...]``), read through the learned layout ``pos``."""
    flat = cache.reshape(cache.shape[0], -1)
    blocks, offs = slots // block_size, slots % block_size
    where = pos[offs]  # [T, H, D, 2] offsets inside each token's block
    got = flat[blocks[:, None, None, None].expand_as(where), where]
    return got[..., 0], got[..., 1]


__all__ = ["learn_layout", "read_slots"]
