"""The native (C++) half-split RoPE kernel: the models' bits for apply, a rounding for strip, and
the eager kernel wherever it cannot run; the kernel choice (modes, environment, first-use checks)."""

from __future__ import annotations

import pytest
import torch

from kvbridge import rope as R
from kvbridge import rope_kernels as K
from kvbridge import rope_native as N
from kvbridge.plugins import get_host
from kvbridge.spec import RopeSpec

needs_compiler = pytest.mark.skipif(N.compiler() is None, reason="no C++ compiler on this machine")


@pytest.fixture
def native_mode():
    K.set_mode("native")
    yield
    K.set_mode(None)


def _eager(fn):
    """``fn()`` on the eager kernel, then back to the kernel under test with its checks kept."""
    with K.using("eager"):
        return fn()


def _keys(dtype, batch=2, heads=3, tokens=37, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, heads, tokens, dim, generator=g).to(dtype),
        torch.randint(0, 40_000, (batch, tokens), generator=g),
    )


def _used(dtype, exact):
    return [v for k, v in K._STATUS.items() if k[0] == "native" and k[2] == dtype and k[-1] == exact]


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["plain", "shared-positions", "transposed", "partial", "odd-half"])
def test_native_matches_eager(native_mode, dtype, case, recwarn):
    partial = 0.5 if case == "partial" else 1.0
    dim = 18 if case == "odd-half" else 32  # rotary half 9: the element-wise loop, not the paired one
    spec = get_host().resolved(
        RopeSpec.make(
            "yarn",
            head_dim=dim,
            factor=4.0,
            original_max_position_embeddings=256,
            max_position_embeddings=1024,
            partial_factor=partial,
        )
    )
    x, pos = _keys(dtype, dim=dim)
    if case == "shared-positions":
        pos = pos[:1]
    if case == "transposed":  # heads and tokens swapped in memory: strided, last dim contiguous
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    got = R.apply(x, pos, spec)
    back = R.strip(got, pos, spec)
    # the native kernel answered both (checked against eager on first use, not fallen back)
    assert _used(dtype, True) == [True] and _used(dtype, False) == [True]
    assert torch.equal(got, _eager(lambda: R.apply(x, pos, spec)))  # the models' bits
    want = _eager(lambda: R.strip(got, pos, spec))
    assert back.dtype == dtype
    eps = torch.finfo(dtype).eps
    assert float((back.float() - want.float()).abs().max()) <= 2 * eps * float(want.abs().max())
    new = pos + 100
    moved, want = R.reposition(got, pos, new, spec), _eager(lambda: R.reposition(got, pos, new, spec))
    assert float((moved.float() - want.float()).abs().max()) <= 4 * eps * float(want.abs().max())
    assert not [w for w in recwarn if "RoPE kernel" in str(w.message)]


@needs_compiler
def test_native_apply_is_the_reference_formula_bit_for_bit(native_mode):
    """x*cos + rotate_half(x)*sin with the tables in the keys' dtype, as transformers computes it."""
    spec = get_host().resolved(RopeSpec.make("default", 1e6, head_dim=64, max_position_embeddings=32768))
    for dtype in (torch.float32, torch.bfloat16):
        x, pos = _keys(dtype, dim=64, tokens=50, seed=4)
        x = x * 37.0  # large keys: every rounding step shows
        x[0, 0, 1, 3], x[0, 1, 2, 40], x[1, 0, 3, :] = float("inf"), float("-inf"), 1e-39  # and the edges
        cos, sin = R.tables(spec, pos, dtype=dtype)
        cos, sin = cos[:, None], sin[:, None]
        rot = torch.cat((-x[..., 32:], x[..., :32]), dim=-1)
        assert torch.equal(R.apply(x, pos, spec), x * cos + rot * sin)


@needs_compiler
def test_native_threads_split_rows_identically(native_mode):
    spec = get_host().resolved(RopeSpec.make(head_dim=64))
    x, pos = _keys(torch.bfloat16, batch=1, heads=4, tokens=1200, dim=64)
    assert x.numel() >= N.PARALLEL_MIN_ELEMENTS
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = R.apply(x, pos, spec)
        torch.set_num_threads(2)
        assert torch.equal(R.apply(x, pos, spec), one)
    finally:
        torch.set_num_threads(before)


def test_unsupported_inputs_take_the_eager_kernel_silently(native_mode, recwarn):
    spec = get_host().resolved(RopeSpec.make(head_dim=32))
    for dtype in (torch.float16, torch.float64):
        x, pos = _keys(dtype)
        assert torch.equal(R.apply(x, pos, spec), _eager(lambda: R.apply(x, pos, spec)))
    x, pos = _keys(torch.float32, dim=64)
    odd = x[..., ::2]  # last dimension not contiguous
    assert torch.equal(R.apply(odd, pos, spec), _eager(lambda: R.apply(odd, pos, spec)))
    assert not [w for w in recwarn if "RoPE kernel" in str(w.message)]
    assert not N.supports(
        odd,
        *R._tables_for(spec, pos, None, "cpu", None).rounded(torch.float32),
        torch.float32,
        exact=True,
        rotary_dim=32,
    )


def test_no_compiler_falls_back_to_eager(native_mode, monkeypatch):
    monkeypatch.setattr(N, "_LIB", {})
    monkeypatch.setattr(K, "_WARNED", set())
    monkeypatch.setattr(N, "compiler", lambda: None)
    spec = get_host().resolved(RopeSpec.make(head_dim=32))
    x, pos = _keys(torch.float32)
    with pytest.warns(RuntimeWarning, match="native RoPE kernel unavailable.*no C\\+\\+ compiler"):
        got = R.apply(x, pos, spec)
    assert torch.equal(got, _eager(lambda: R.apply(x, pos, spec)))
    assert torch.equal(R.apply(x, pos, spec), got)  # eager from now on, no second warning needed


def test_failed_build_is_unavailable_and_remembered(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path))
    monkeypatch.delenv("KVBRIDGE_NO_CACHE", raising=False)
    monkeypatch.setattr(N, "_LIB", {})
    monkeypatch.setattr(N, "compiler", lambda: "/bin/false")
    with pytest.raises(N.Unavailable, match="failed"):
        N.library()
    with pytest.raises(N.Unavailable):  # remembered in this process: no second build attempt
        N.library()
    names = [p.name for p in (tmp_path / "native").iterdir()]
    assert len(names) == 1 and names[0].endswith(".so.failed")  # no half-written library, no build folder
    # a later process in the default (auto) mode does not run the compiler again
    monkeypatch.setattr(N, "_LIB", {})
    monkeypatch.setattr(N.subprocess, "run", lambda *a, **k: pytest.fail("compiler run again"))
    with pytest.raises(N.Unavailable, match="failed before"):
        N.library(retry_failed=False)


def test_auto_mode_is_silent_without_a_compiler(monkeypatch, recwarn):
    monkeypatch.setattr(N, "_LIB", {})
    monkeypatch.setattr(N, "compiler", lambda: None)
    monkeypatch.delenv(K.KERNEL_ENV, raising=False)
    monkeypatch.delenv(K.LEGACY_ENV, raising=False)
    K.set_mode(None)
    try:
        assert K.mode() == "auto"
        spec = get_host().resolved(RopeSpec.make(head_dim=32))
        x, pos = _keys(torch.bfloat16)
        got = R.apply(x, pos, spec)
        K.set_mode("eager")
        assert torch.equal(got, R.apply(x, pos, spec))
    finally:
        K.set_mode(None)
    assert not [w for w in recwarn if "RoPE kernel" in str(w.message)]


@needs_compiler
def test_library_is_built_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path))
    monkeypatch.delenv("KVBRIDGE_NO_CACHE", raising=False)
    monkeypatch.setattr(N, "_LIB", {})
    N.library()
    files = sorted(p.name for p in (tmp_path / "native").iterdir())
    assert files == [N._LIB["path"].name] and files[0].startswith("kvb_rope_")
    stamp = N._LIB["path"].stat().st_mtime_ns
    monkeypatch.setattr(N, "_LIB", {})
    N.library()  # a new process: found in the cache, not rebuilt
    assert N._LIB["path"].stat().st_mtime_ns == stamp


def test_mismatch_disables_native(native_mode, monkeypatch):
    monkeypatch.setattr(N, "rotate", lambda x, *a, **k: torch.zeros_like(x))
    spec = get_host().resolved(RopeSpec.make(head_dim=32))
    x, pos = _keys(torch.float32)
    with pytest.warns(RuntimeWarning, match="native RoPE kernel disagrees"):
        got = R.apply(x, pos, spec)
    assert torch.equal(got, _eager(lambda: R.apply(x, pos, spec)))


@needs_compiler
def test_no_cache_builds_privately_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBRIDGE_NO_CACHE", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(N.tempfile, "tempdir", None)  # re-read TMPDIR
    monkeypatch.setattr(N, "_LIB", {})
    N.library()
    assert N._LIB["path"].parent.parent == tmp_path
    assert list(tmp_path.iterdir()) == []  # loaded, then the private folder removed
    spec = get_host().resolved(RopeSpec.make(head_dim=32))
    x, pos = _keys(torch.float32)
    K.set_mode("native")
    try:
        assert torch.equal(R.apply(x, pos, spec), _eager(lambda: R.apply(x, pos, spec)))
    finally:
        K.set_mode(None)


def test_mode_from_environment(monkeypatch):
    monkeypatch.delenv(K.KERNEL_ENV, raising=False)
    monkeypatch.setattr(K, "_WARNED", set())
    monkeypatch.setenv(K.LEGACY_ENV, "1")  # the removed compiled kernel: deprecated, means native
    K.set_mode(None)
    with pytest.warns(RuntimeWarning, match="deprecated.*using native"):
        assert K.mode() == "native"
    monkeypatch.setenv(K.LEGACY_ENV, "0")
    K.set_mode(None)
    assert K.mode() == "auto"  # the default
    with pytest.raises(ValueError):
        K.set_mode("fast")
    with pytest.warns(RuntimeWarning, match="'compiled' is deprecated"):
        K.set_mode("compiled")
    assert K.mode() == "native"
    monkeypatch.setenv(K.KERNEL_ENV, "eager")  # the variable wins over the legacy one
    monkeypatch.setenv(K.LEGACY_ENV, "1")
    K.set_mode(None)
    assert K.mode() == "eager"
    monkeypatch.setenv(K.KERNEL_ENV, "fast")
    monkeypatch.delenv(K.LEGACY_ENV)
    K.set_mode(None)
    with pytest.warns(RuntimeWarning, match="not one of"):
        assert K.mode() == "auto"
    K.set_mode(None)


def test_using_restores_the_mode_and_the_checks():
    K.set_mode("native")
    K._STATUS["probe"] = True
    with K.using("eager"):
        assert K.mode() == "eager" and "probe" not in K._STATUS
    assert K.mode() == "native" and K._STATUS.get("probe") is True
    K.set_mode(None)
