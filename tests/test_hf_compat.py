"""kvbridge.hf_compat: the cache keyword of either transformers release."""

from __future__ import annotations

from kvbridge.hf_compat import cache_kwargs, cache_name


class Old:
    def forward(self, input_ids=None, past_key_values=None, **kwargs):
        return kwargs


class New:
    def forward(self, input_ids=None, cache=None, **kwargs):
        return kwargs


class Neither:
    def forward(self, input_ids=None, **kwargs):
        return kwargs


def test_the_name_each_forward_takes():
    assert cache_name(Old()) == "past_key_values"
    assert cache_name(New()) == "cache"
    assert cache_name(Neither()) == "cache"
    assert cache_kwargs(Old(), 1) == {"past_key_values": 1}


def test_installed_transformers_takes_the_name_given():
    import inspect

    from transformers import LlamaForCausalLM

    name = cache_name(LlamaForCausalLM.__new__(LlamaForCausalLM))
    assert name in inspect.signature(LlamaForCausalLM.forward).parameters
