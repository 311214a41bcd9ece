"""The multi-turn hand-off: a session that maps its cache at each switch against one that re-prefills.

Same model under two names with the identity mapping: the mapped session is the re-prefill session
exactly (KL 0, same tokens). A noisy mapping: exact before the first switch, drift after it."""

from __future__ import annotations

import pytest

SCRIPT = [("small", "ROMEO: What light"), ("large", "\nJULIET: Ay me"), ("small", "\nROMEO: She speaks")]


def test_identity_handoff_is_exact(base):
    from kvbridge.harness.session import compare_handoff, drift_table
    from kvbridge.transfer import IdentityMapping

    model, tok = base
    maps = {("small", "large"): IdentityMapping(), ("large", "small"): IdentityMapping()}
    res = compare_handoff({"small": model, "large": model}, tok, maps, SCRIPT, max_new_tokens=5)
    assert res["switches"] == 2 and res["same_history"]
    assert [t["switched"] for t in res["turns"]] == [False, True, True]
    for t in res["turns"]:
        assert t["tokens_equal"] and t["kl_max"] == pytest.approx(0, abs=1e-9)
    assert "| 1 | large | yes |" in drift_table(res)


def test_noisy_handoff_drifts_only_after_a_switch(base, noisy):
    from kvbridge.harness.session import compare_handoff

    model, tok = base
    maps = {("small", "large"): noisy(1.0), ("large", "small"): noisy(1.0)}
    res = compare_handoff({"small": model, "large": model}, tok, maps, SCRIPT, max_new_tokens=5)
    first, second = res["turns"][0], res["turns"][1]
    assert first["kl_max"] == 0.0 and first["tokens_equal"]  # no switch yet: the same cache
    assert second["kl_mean"] > 0  # the mapped cache differs from the re-prefilled one


def test_session_refusals(base):
    from kvbridge.errors import KVBridgeError
    from kvbridge.harness.session import Session

    model, tok = base
    s = Session({"a": model, "b": model}, tok)
    s.turn("a", "Hello", max_new_tokens=2)
    with pytest.raises(KVBridgeError, match="no mapping from 'a' to 'b'"):
        s.turn("b", " there")
    with pytest.raises(KVBridgeError, match="unknown session model 'c'"):
        s.turn("c", " there")
    with pytest.raises(KVBridgeError, match="unknown session mode"):
        Session({"a": model}, tok, mode="replay")
