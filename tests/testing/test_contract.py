"""The contract suite runs on a built-in adapter and on a plugin-style RoPE variant."""

from __future__ import annotations

import torch

from kvbridge.plugin_types import RopeVariant
from kvbridge.plugins import make_host
from kvbridge.spec import RopeSpec
from kvbridge.testing.contract import AdapterContract, RopeVariantContract


def _ntk_fixed(rope: RopeSpec, seq_len, device):
    """A toy 'NTK-aware fixed' variant: base scaled by factor^(d/(d-2)), no length dependence."""
    dim = rope.rotary_dim
    base = rope.theta * rope.param("factor", 2.0) ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)), 1.0


class TestPluginRopeVariant(RopeVariantContract):
    variant = RopeVariant(name="ntk-fixed", inv_freq=_ntk_fixed, description="test variant")
    specs = (
        RopeSpec.make("ntk-fixed", 10000.0, head_dim=32, factor=4.0),
        RopeSpec.make("ntk-fixed", 500000.0, head_dim=64, partial_factor=0.5, interleaved=True, factor=2.0),
    )


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
    specs = (
        RopeSpec.make("theta-scaled", 10000.0, head_dim=32, factor=4.0),
        RopeSpec.make("theta-scaled", 10000.0, head_dim=64, partial_factor=0.5, factor=2.0),
    )


# -- defaults against transformers' config classes --------------------------------------------------------
import dataclasses  # noqa: E402
from typing import ClassVar  # noqa: E402

import pytest  # noqa: E402

from kvbridge.builtin.families import builtin_adapters  # noqa: E402
from kvbridge.builtin.families.table import MistralAdapter  # noqa: E402
from kvbridge.testing.contract import check_defaults  # noqa: E402


@dataclasses.dataclass(frozen=True)
class _Mixtral(MistralAdapter):
    """A Mixtral family file written from Mistral's: Mixtral has no default window, theta 1e6."""

    name: str = "mixtral-test"
    model_types: tuple = ("mixtral",)
    DEFAULT_WINDOW: ClassVar[int | None] = None
    DEFAULT_THETA: ClassVar[float] = 1_000_000.0


@dataclasses.dataclass(frozen=True)
class _MixtralWrongTheta(_Mixtral):
    DEFAULT_THETA: ClassVar[float] = 10_000.0  # Mistral's base, not Mixtral's


def test_defaults_contract_catches_a_wrong_default_theta():
    check_defaults(_Mixtral(), "mixtral")
    with pytest.raises(AssertionError, match="theta"):
        check_defaults(_MixtralWrongTheta(), "mixtral")


@pytest.mark.parametrize("adapter", builtin_adapters(), ids=lambda a: a.name)
def test_every_builtin_adapter_has_transformers_defaults(adapter):
    for model_type in adapter.model_types:
        assert check_defaults(adapter, model_type)
