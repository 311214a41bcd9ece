"""kvbridge.run: the resolved run a stage reads (a loaded pair, the host, the stage's settings)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvbridge.run import InMemoryModel, Run


def _pair():
    return SimpleNamespace(source="S", target="T", tokenizer={"digest": "d"})


def test_a_run_reads_its_pair_and_keeps_what_was_derived_once():
    run = Run(_pair(), settings="asked", host="host")
    assert (run.source, run.target, run.tokenizer, run.settings) == ("S", "T", {"digest": "d"}, "asked")
    calls = []
    assert run.once("k", lambda: calls.append(1) or 41) == 41
    assert run.once("k", lambda: calls.append(1) or 42) == 41 and calls == [1]
    other = run.with_settings("other")
    assert other.settings == "other" and other.once("k", lambda: 0) == 41  # the models did not change
    with pytest.raises(AttributeError):
        run.settings = "x"  # frozen


def test_a_single_model_run_reads_its_model():
    run = Run("loaded model", settings="asked", host="host")
    assert run.model == "loaded model" and run.settings == "asked"


def test_run_of_uses_the_process_host_by_default():
    from kvbridge.plugins import get_host

    assert Run.of(_pair(), None).host is get_host()


def test_an_in_memory_model_reads_like_a_loaded_one():
    from kvbridge.plugins import make_host
    from kvbridge.testing.planted import llama_config, llama_model

    host = make_host(entry_points=False)
    model = llama_model(llama_config(num_hidden_layers=2), seed=0)
    m = InMemoryModel.of(model, host, name="mine")
    assert m.spec.num_layers == 2 and m.name == "mine" and m.ref is None and m.tokenizer is None
