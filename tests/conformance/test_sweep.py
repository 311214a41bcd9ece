"""The conformance sweep on a representative subset: every adapter at least once.

Every built-in family's model type (each family file), the generic adapter on an MoE family,
NoPE layers, a multimodal wrapper (family file on ``text_config``), and a pure recurrent model
(refused). The whole registry is ``kvbridge conformance`` (docs/supported-models.md).
"""

from __future__ import annotations

import pytest

from kvbridge.builtin.families import builtin_adapters
from kvbridge.conformance import sweep
from kvbridge.plugins import make_host

HOST = make_host(entry_points=False)
FAMILY_TYPES = sorted({a.model_types[0] for a in builtin_adapters()})
EXACT = FAMILY_TYPES + [
    "qwen3_moe",
    "smollm3",
    "gemma3",
    "glm_moe_dsa",  # glm_moe_dsa: MLA + indexer keys
    "dory",  # dory: a cache copy per recurrent loop
    "dots3_note_text",
]  # MLA with a partial factor of the query head; per-kind RoPE tables


@pytest.mark.parametrize("model_type", EXACT)
def test_exact(model_type):
    r = sweep.run_type(model_type, host=HOST)
    assert r.status == "exact", f"{model_type}: {r.status}: {r.reason}"
    assert r.max_logit_diff is not None and r.max_logit_diff <= sweep.LOGIT_TOL


def test_every_adapter_is_covered():
    from kvbridge.conformance.tiny import tiny_config_dict

    names = {HOST.adapter_for(tiny_config_dict(t)).name for t in EXACT}
    assert {a.name for a in builtin_adapters()} <= names and "generic" in names
    assert any(n.startswith("gemma3_text (in gemma3)") for n in names)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["deepseek_v3", "qwen3_next", "gemma3n_text", "llama4_text", "gpt_oss"])
def test_exact_special_layouts(model_type):
    r = sweep.run_type(model_type, host=HOST)
    assert r.status == "exact", f"{model_type}: {r.status}: {r.reason}"


@pytest.mark.parametrize(
    "model_type, why", [("xlnet", "mems"), ("reformer", "LSH buckets"), ("gemma4_assistant", "caches none of its own")]
)
def test_caches_of_another_kind_are_refused_with_the_reason(model_type, why):
    r = sweep.run_type(model_type, host=HOST)
    assert r.status == "refused" and why in r.reason


def test_pure_recurrent_is_refused_with_the_reason():
    r = sweep.run_type("mamba", host=HOST)
    assert r.status == "refused" and "no attention KV cache" in r.reason


def test_a_wrong_fact_is_caught(monkeypatch):
    """The sweep is not a rubber stamp: a NoPE layer described as RoPE lands in `wrong`."""
    from kvbridge.builtin.families import _generic_facts as facts

    monkeypatch.setattr(facts, "nope_layers", lambda *a, **k: ())
    r = sweep.run_type("smollm3", host=HOST)
    assert r.status == "wrong" and "NoPE" in r.reason


@pytest.mark.parametrize("fact, reason", [("INDEXER_ROPE_LAST", "indexer keys"), ("MLA_COMPLEX", "of its values")])
def test_a_wrong_sparse_attention_fact_is_caught(monkeypatch, fact, reason):
    """The RoPE'd slots of an MLA + indexer cache are checked by re-positioning: indexer keys
    rotated at the wrong dims, or the MLA RoPE key paired (2i, 2i+1), land in `wrong`."""
    from kvbridge.builtin.families import _generic_facts as facts

    monkeypatch.setattr(facts, fact, getattr(facts, fact) | {"glm_moe_dsa"})
    r = sweep.run_type("glm_moe_dsa", host=HOST)
    assert r.status == "wrong" and reason in r.reason, r.reason


def test_markdown_table_counts():
    from kvbridge.conformance import report

    rows = [
        sweep.Result("a", "exact", "llama"),
        sweep.Result("b", "refused", "", "no attention KV cache"),
        sweep.Result("c", "not-built", "", "x"),
    ]
    text = report.markdown(rows)
    assert "1 of 2 buildable model types exact (3 in the registry)" in text
    assert "| b | refused |" in text and "kvbridge conformance" in text


def test_proportional_rope_round_trips():
    from kvbridge.spec import RopeSpec
    from kvbridge.testing.contract import check_rope_round_trip

    rope = RopeSpec.make("proportional", 1e6, head_dim=32, rope_proportion=0.25)
    assert check_rope_round_trip(rope, host=HOST) < 1e-5


def _raise(exc):
    def fail(*args, **kwargs):
        raise exc

    return fail


@pytest.mark.parametrize(
    "target, exc, status, reason",
    [
        ("kvbridge.conformance.tiny.tiny_config_dict", KeyError("x"), "not-built", "config: KeyError"),
        ("kvbridge.conformance.tiny.build", RuntimeError("no"), "not-built", "RuntimeError: no"),
        ("kvbridge.conformance.sweep.compare_facts", RuntimeError("bug"), "crash", "facts: RuntimeError: bug"),
        ("kvbridge.testing.contract.check_identity_transfer", AssertionError("diff"), "wrong", "identity: diff"),
        ("kvbridge.testing.contract.check_identity_transfer", RuntimeError("bug"), "crash", "identity: RuntimeError"),
    ],
)
def test_each_stage_failure_lands_in_its_class(monkeypatch, target, exc, status, reason):
    """A failure is classed by where it happens: building is transformers', the rest kvbridge's."""
    monkeypatch.setattr(target, _raise(exc))
    r = sweep.run_type("llama", host=HOST)
    assert r.status == status and r.reason.startswith(reason), (r.status, r.reason)
    assert (r.adapter == "") == (status == "not-built")  # the description is kept once it was made


def test_a_refusal_and_an_inapplicable_reference_after_describe(monkeypatch):
    from kvbridge.errors import ConfigError
    from kvbridge.testing.contract import NotApplicable

    monkeypatch.setattr("kvbridge.conformance.sweep.compare_facts", _raise(ConfigError("cache differs", "x")))
    r = sweep.run_type("llama", host=HOST)
    assert (r.status, r.reason, r.adapter) == ("refused", "cache differs", "llama")
    monkeypatch.undo()
    monkeypatch.setattr("kvbridge.testing.contract.check_identity_transfer", _raise(NotApplicable("own fails")))
    r = sweep.run_type("llama", host=HOST)
    assert (r.status, r.reason) == ("not-built", "own fails") and r.max_key_diff is not None
