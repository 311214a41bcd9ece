"""The opt-in compiled half-split RoPE kernel: same bits as the eager kernel, and a fallback everywhere."""

from __future__ import annotations

import pytest
import torch

from kvbridge import rope as R
from kvbridge import rope_compile as RC
from kvbridge.plugins import get_host
from kvbridge.spec import RopeSpec


@pytest.fixture
def compiled_mode():
    RC.set_mode("compiled")
    yield
    RC.set_mode(None)


def _keys(dtype, tokens=37):
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, tokens, 32, generator=g).to(dtype), torch.randint(0, 40_000, (2, tokens), generator=g)


def _eager(fn):
    """``fn()`` on the eager kernel, then back to the kernel under test with its checks kept."""
    with RC.using("eager"):
        return fn()


def test_mode_from_environment(monkeypatch):
    monkeypatch.delenv(RC.KERNEL_ENV, raising=False)
    monkeypatch.setenv(RC.ENV, "1")
    RC.set_mode(None)
    assert RC.mode() == "compiled"
    monkeypatch.setenv(RC.ENV, "0")
    RC.set_mode(None)
    assert RC.mode() == "auto"  # the default
    with pytest.raises(ValueError):
        RC.set_mode("fast")
    monkeypatch.setenv(RC.KERNEL_ENV, "native")  # the newer variable wins
    RC.set_mode(None)
    assert RC.mode() == "native"
    monkeypatch.setenv(RC.KERNEL_ENV, "fast")
    RC.set_mode(None)
    with pytest.warns(RuntimeWarning, match="not one of"):
        assert RC.mode() == "auto"
    RC.set_mode(None)


def test_compile_failure_falls_back_to_eager(compiled_mode, monkeypatch):
    def broken(*_a, **_k):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setitem(RC._FN, "fn", broken)
    monkeypatch.setattr(RC, "_WARNED", set())
    spec = get_host().resolved(RopeSpec.make(head_dim=32))
    x, pos = _keys(torch.float32)
    with pytest.warns(RuntimeWarning, match="unavailable"):
        got = R.apply(x, pos, spec)
    assert torch.equal(got, _eager(lambda: R.apply(x, pos, spec)))
    assert R.apply(x, pos, spec).shape == x.shape  # stays on eager, no second warning needed


def test_mismatch_disables_compiled(compiled_mode, monkeypatch):
    monkeypatch.setitem(RC._FN, "fn", lambda x, c, s, dt: torch.zeros(x.shape, dtype=dt))
    spec = get_host().resolved(RopeSpec.make(head_dim=32))
    x, pos = _keys(torch.float32)
    with pytest.warns(RuntimeWarning, match="disagrees"):
        got = R.apply(x, pos, spec)
    assert torch.equal(got, _eager(lambda: R.apply(x, pos, spec)))
    assert torch.equal(R.apply(x, pos, spec), got)  # disabled for this key from now on


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_kernel_matches_eager(compiled_mode, dtype, recwarn):
    """A real torch.compile: apply bit-identical to the eager (= the models') rotation, strip and
    reposition within a rounding; where compiling is impossible the fallback answers the same."""
    spec = get_host().resolved(
        RopeSpec.make(
            "yarn", head_dim=32, factor=4.0, original_max_position_embeddings=256, max_position_embeddings=1024
        )
    )
    x, pos = _keys(dtype)
    got = R.apply(x, pos, spec)
    assert torch.equal(got, _eager(lambda: R.apply(x, pos, spec)))
    for tokens in (5, 64):  # other shapes: no recompile needed (dynamic), same bits
        y, p = _keys(dtype, tokens)
        assert torch.equal(R.apply(y, p, spec), _eager(lambda: R.apply(y, p, spec)))
    back = R.strip(got, pos, spec)
    assert back.dtype == dtype
    eps = torch.finfo(dtype).eps
    assert float((back.float() - _eager(lambda: R.strip(got, pos, spec)).float()).abs().max()) <= 4 * eps * 8
    assert not [w for w in recwarn if "disagrees" in str(w.message)]


def test_using_restores_the_mode_and_the_checks():
    RC.set_mode("native")
    RC._STATUS["probe"] = True
    with RC.using("eager"):
        assert RC.mode() == "eager" and "probe" not in RC._STATUS
    assert RC.mode() == "native" and RC._STATUS.get("probe") is True
    RC.set_mode(None)
