"""fit() takes its options and CalibrationConfig; keyword settings are checked by name, the same way
for model objects as for references (one path)."""

from __future__ import annotations

import pytest

from kvbridge.errors import KVBridgeError


def test_fit_refuses_an_unknown_keyword_before_touching_the_models():
    from kvbridge.fit import fit

    with pytest.raises(KVBridgeError, match="fit has no setting 'topk'.*did you mean top_k"):
        fit(None, None, None, topk=2)
    with pytest.raises(KVBridgeError, match="fitter 'ridge-headwise' has no option 'top_k'"):
        fit(None, None, None, fitter="ridge-headwise", options={"top_k": 2})


def test_model_objects_named_by_the_deprecated_keywords_still_record_the_names(planted, fit_host):
    from kvbridge.fit import fit

    with pytest.warns(DeprecationWarning, match="model_run"):
        mapping = fit(
            planted["source"],
            planted["target"],
            planted["ids"][:8],
            top_k=1,
            stride=2,
            host=fit_host,
            distributed=None,
            source_name="src-name",
            target_name="tgt-name",
            source_revision="rev-a",
        )
    assert (mapping.manifest["source"]["name"], mapping.manifest["target"]["name"]) == ("src-name", "tgt-name")
    assert (mapping.manifest["source"]["revision"], mapping.manifest["target"]["revision"]) == ("rev-a", None)
    assert mapping.manifest["tokenizer"] is None  # fitted from token ids of models given in Python


def test_a_tokenizer_keyword_with_references_is_refused(fit_host):
    """``tokenizer=`` is for model objects; references bring their own (not silently ignored)."""
    from kvbridge.errors import ConfigError
    from kvbridge.fit import fit

    with pytest.raises(ConfigError, match="tokenizer=.* is for model objects"):
        fit("zoo:base", "zoo:wide", ["some text"], tokenizer=object(), host=fit_host)
