"""evaluate() takes an EvalConfig; keyword settings are checked by name."""

from __future__ import annotations

import pytest

from kvbridge.errors import KVBridgeError


def test_eval_config_overrides_and_refusals():
    from kvbridge.evaluate import eval_config
    from kvbridge.evaluate.conditions import CONDITIONS, EvalConfig

    cfg = eval_config(EvalConfig(prefix_len=10), continuation_len=4, conditions=None)
    assert (cfg.prefix_len, cfg.continuation_len, cfg.conditions, cfg.bootstrap) == (10, 4, CONDITIONS, 1000)
    with pytest.raises(KVBridgeError, match="no setting 'prefix_lenn'.*did you mean prefix_len"):
        eval_config(prefix_lenn=3)
