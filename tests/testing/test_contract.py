"""The contract suite runs on a built-in adapter and on a plugin-style RoPE variant."""

from __future__ import annotations

import torch

from kvbridge.plugin_types import RopeVariant
from kvbridge.plugins import make_host
from kvbridge.check.spec import RopeSpec
from kvbridge.testing.contract import AdapterContract, RopeVariantContract


def _ntk_fixed(rope: RopeSpec, seq_len, device):
    """A toy 'NTK-aware fixed' variant: base scaled by factor^(d/(d-2)), no length dependence."""
    dim = rope.rotary_dim
    base = rope.theta * rope.param("factor", 2.0) ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)), 1.0


class TestPluginRopeVariant(RopeVariantContract):
    variant = RopeVariant(name="ntk-fixed", inv_freq=_ntk_fixed, description="test variant")
    specs = (RopeSpec.make("ntk-fixed", 10000.0, head_dim=32, factor=4.0),
             RopeSpec.make("ntk-fixed", 500000.0, head_dim=64, partial_factor=0.5, interleaved=True, factor=2.0))


class TestLlamaAdapterContract(AdapterContract):
    adapter = make_host(entry_points=False).adapter_for({"model_type": "llama"})


# A RoPE variant written exactly as the kvbridge_register_rope_variants documentation says:
# inv_freq(rope, seq_len) -> (rope.rotary_dim // 2 inverse frequencies, attention scaling).
def _doc_example_inv_freq(rope, seq_len):
    import torch

    dim = rope.rotary_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
    return 1.0 / (rope.theta * rope.param("factor", 1.0)) ** exponents, 1.0


class TestRopeVariantWrittenToTheHookDocs(RopeVariantContract):
    variant = RopeVariant(name="theta-scaled", inv_freq=_doc_example_inv_freq, description="theta x factor")
    specs = (RopeSpec.make("theta-scaled", 10000.0, head_dim=32, factor=4.0),
             RopeSpec.make("theta-scaled", 10000.0, head_dim=64, partial_factor=0.5, factor=2.0))
