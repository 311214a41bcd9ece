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


class OldModule:
    def forward(self, input_ids=None, past_key_values=None, **kwargs):
        return {"input_ids": input_ids, "past_key_values": past_key_values, "rest": kwargs}

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def test_an_old_release_model_takes_cache_as_past_key_values():
    import pytest

    from kvbridge.hf_compat import accept_cache_keyword

    old = accept_cache_keyword(OldModule())
    got = old(input_ids=3, cache="C", use_cache=True)
    assert got == {"input_ids": 3, "past_key_values": "C", "rest": {"use_cache": True}}
    assert old(input_ids=3, past_key_values="P")["past_key_values"] == "P"
    with pytest.raises(TypeError, match="both"):
        old(cache="C", past_key_values="P")
    new = New()
    assert accept_cache_keyword(new) is new and "forward" not in vars(new)
