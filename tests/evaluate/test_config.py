"""evaluate() takes eval's one settings type, EvalSettings; keyword settings are checked by name."""

from __future__ import annotations

import pytest

from kvbridge.errors import KVBridgeError


def test_eval_config_overrides_and_refusals():
    from kvbridge.evaluate import eval_config
    from kvbridge.evaluate.settings import CONDITIONS, EvalSettings

    cfg = eval_config(EvalSettings(prefix_len=10), continuation_len=4, conditions=None)
    assert isinstance(cfg, EvalSettings) and cfg.mapping is None and cfg.corpus is None
    assert (cfg.prefix_len, cfg.continuation_len, cfg.condition_names(), cfg.bootstrap) == (10, 4, CONDITIONS, 1000)
    assert eval_config(conditions=("native", "source")).condition_names() == ("native", "source")
    with pytest.raises(KVBridgeError, match="no setting 'prefix_lenn'.*did you mean prefix_len"):
        eval_config(prefix_lenn=3)
    with pytest.raises(KVBridgeError, match="--prefix-len must be a whole number >= 1, got '48'"):
        eval_config(prefix_len="48")  # refused as the command line refuses it, not coerced
    with pytest.raises(KVBridgeError, match="unknown condition 'nativ'"):
        eval_config(conditions=("nativ",))


def test_eval_config_is_a_deprecated_constructor_of_the_settings():
    from kvbridge.evaluate.conditions import EvalConfig
    from kvbridge.evaluate.settings import EvalSettings

    with pytest.warns(DeprecationWarning, match="EvalSettings"):
        cfg = EvalConfig(prefix_len=10, conditions=("native", "transferred"))
    assert isinstance(cfg, EvalSettings) and cfg.continuation_len == 32  # its old default kept
    assert cfg.condition_names() == ("native", "transferred") and cfg.sample_len == 10 + 32 + 1


def test_a_corpus_run_needs_the_mapping_and_the_corpus():
    from types import SimpleNamespace

    from kvbridge.evaluate.run import evaluate_run
    from kvbridge.evaluate.settings import EvalSettings

    side = SimpleNamespace(model=None, tokenizer=None)
    for settings, flag in ((EvalSettings(corpus="c.txt"), "--mapping"), (EvalSettings(mapping="identity"), "--corpus")):
        run = SimpleNamespace(source=side, target=side, settings=settings)
        with pytest.raises(KVBridgeError, match=f"{flag} is not set"):
            evaluate_run(run)
