"""RoPE types that only families without a family file use, registered by the families plugin.

``proportional`` (Gemma 4, LFM3 in transformers 5.24): the table spans the whole head
(half-split pairs ``i`` / ``i + head_dim/2``), the first ``int(p * head_dim // 2)`` frequencies
are ``theta^(-2i/head_dim)`` and the rest are zero (those dims do not rotate), all divided by
``factor``. The proportion ``p`` travels in ``RopeSpec.scaling`` as ``rope_proportion`` (the
spec's ``partial_factor`` stays 1: the pairing is over the full head). Same operations, order
and precision as ``transformers.modeling_rope_utils._compute_proportional_rope_parameters``.
"""

from __future__ import annotations

from kvbridge.builtin.rope_variants import RopeVariant


def _proportional_inv_freq(rope, seq_len, device="cpu"):
    import torch

    head_dim = rope.head_dim
    angles = int(float(rope.param("rope_proportion", 1.0)) * head_dim // 2)
    inv = 1.0 / (
        rope.theta
        ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / head_dim)
    )
    inv = torch.cat((inv, torch.zeros(max(0, head_dim // 2 - angles), dtype=torch.float32, device=device)), dim=0)
    return inv / float(rope.param("factor", 1.0)), 1.0


PROPORTIONAL = RopeVariant(
    "proportional",
    _proportional_inv_freq,
    "Gemma 4: whole-head pairing, the first p*head_dim/2 frequencies rotate, the rest are 0",
)

VARIANTS = (PROPORTIONAL,)
