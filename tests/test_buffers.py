"""kvbridge.buffers.populate: a fresh buffer's pages faulted in up front, its contents unchanged."""

from __future__ import annotations

import resource
import sys

import pytest
import torch

from kvbridge import buffers


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_populate_keeps_what_is_there():
    t = torch.arange(4 << 20, dtype=torch.float32)  # 16 MiB, already written
    want = t.clone()
    assert buffers.populate(t, threads=2) is t
    assert torch.equal(t, want)


def test_populate_is_nothing_at_one_thread_or_under_the_size():
    t = torch.empty(4 << 20)
    before = _faults()
    buffers.populate(t, threads=1)
    buffers.populate(torch.empty(1 << 10), threads=2)
    assert _faults() - before < 64  # no 16 MiB of pages faulted (4,096 pages of 4 KiB)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_POPULATE_WRITE) is Linux's")
def test_populate_of_a_buffer_without_a_whole_page_is_nothing(monkeypatch):
    monkeypatch.setattr(buffers, "HUGE_PAGE_MIN", 0)
    t = torch.arange(8, dtype=torch.float32)[1:5]  # 16 bytes inside one page
    assert buffers.populate(t, threads=2) is t and t.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_populate_takes_the_first_touch_faults_before_the_write():
    t = torch.empty(8 << 20)  # 32 MiB of fresh pages (4 KiB: not advised onto huge pages)
    buffers.populate(t, threads=2)
    before = _faults()
    t.fill_(1.0)
    after = _faults() - before
    if after > 4000:  # a kernel without the advice (before 5.14) answers EINVAL: the write faults
        fn = buffers._libc_madvise()
        probe = torch.empty(8 << 20)
        start = -(-probe.data_ptr() // 4096) * 4096
        if fn is None or fn(start, 1 << 20, buffers._POPULATE_WRITE) != 0:
            pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    assert after < 64  # 8,192 pages would fault without it


def test_the_dense_map_with_populated_results_is_bitwise_the_same(monkeypatch):
    from kvbridge.fit.mapping import FittedMapping, LayerMap
    from tests.fit.test_mapping import _spec

    src, tgt = _spec(3, 2, 32), _spec(2, 2, 32)
    g = torch.Generator().manual_seed(3)

    def weights():  # wk [k·fs, ft], bk [ft], wv, bv
        return [torch.randn(128, 64, generator=g), torch.randn(64, generator=g)] * 2

    m = FittedMapping(src, tgt, [LayerMap("dense", s, *weights()) for s in ((0, 2), (1, 0))])
    keys = [torch.randn(1, 2, 700, 32, generator=g) for _ in range(3)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        plain = m.map_tensors(keys, keys)
        calls = []
        real = buffers.populate
        monkeypatch.setattr(buffers, "HUGE_PAGE_MIN", 0)
        monkeypatch.setattr("kvbridge.fit.mapping.populate", lambda t: calls.append(t.numel()) or real(t))
        populated = m.map_tensors(keys, keys)
    finally:
        torch.set_num_threads(threads)
    assert calls  # the results went through populate
    for a, b in zip(plain[0] + plain[1], populated[0] + populated[1]):
        assert torch.equal(a, b)
