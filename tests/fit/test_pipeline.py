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
