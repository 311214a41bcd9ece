"""Buffers the codec and the map share: token blocks that keep every GEMM on its one-GEMM bits, and
fresh CPU buffers advised onto transparent huge pages (:func:`fresh`). Below the stages, so that
:mod:`kvbridge.transfer` and :mod:`kvbridge.fit.mapping` both read them without an import going up."""

from __future__ import annotations

import ctypes
import mmap

import torch

from kvbridge.durable import libc_function
from kvbridge.threads import thread_pool


def token_blocks(n: int, size: int) -> list:
    """``[(start, stop)]`` covering ``n`` tokens in blocks of ``size``, a remainder under half a block
    joined to the last one. No block is shorter than ``size // 2`` (unless ``n`` is): a GEMM of a few
    rows can take another BLAS path (MKL: 1-3 rows round differently), and with blocks of 4 rows or
    more every row's result is bitwise the one-GEMM result (tests/fit/test_mapping.py)."""
    starts = list(range(0, n, max(1, size)))
    if len(starts) > 1 and n - starts[-1] < size / 2:
        starts.pop()
    return [(a, starts[i + 1] if i + 1 < len(starts) else n) for i, a in enumerate(starts)]


#: fresh CPU buffers at least this large are asked to be backed by transparent huge pages
HUGE_PAGE_MIN = 8 << 20
#: ... and at most this large: with ``defrag=madvise`` a fault on an advised region compacts memory
#: when no free 2 MiB page is at hand, and a result of 470 MiB (16,384 tokens) took the map from 1.28x
#: its floor on 4 KiB pages to 1.82x advised (BENCHMARKS.md, "Issue 35: 32,768 tokens"); up to 235 MiB
#: (8,192 tokens) the two were within 5%
HUGE_PAGE_MAX = 256 << 20
_HUGE = 2 << 20
_MADVISE: dict = {}  # "populate": False once the kernel refused MADV_POPULATE_WRITE


def fresh(shape, dtype=torch.float32, device=None) -> torch.Tensor:
    """``torch.empty``, with a large CPU buffer advised onto transparent huge pages before its first
    write (Linux ``madvise(MADV_HUGEPAGE)`` on its 2 MiB-aligned interior; a hint, results are the
    same). A fresh buffer costs one page fault per 4 KiB page on first touch: 58 MiB of mapped keys
    took ~30 ms of faults against ~7 ms on 2 MiB pages, a sixth of their GEMM (BENCHMARKS.md, "Map
    and transfer"). Elsewhere (no libc, THP off, another device) it is plain ``torch.empty``."""
    t = torch.empty(shape, dtype=dtype, device=device)
    nbytes = t.numel() * t.element_size()
    if t.device.type != "cpu" or not HUGE_PAGE_MIN <= nbytes <= HUGE_PAGE_MAX:
        return t
    madvise = _libc_madvise()
    if madvise is not None:
        start = -(-t.data_ptr() // _HUGE) * _HUGE
        end = (t.data_ptr() + nbytes) // _HUGE * _HUGE
        if end > start:
            madvise(start, end - start, 14)  # MADV_HUGEPAGE; a failure changes nothing
    return t


#: ``madvise`` advice: fault a range in as if written (Linux 5.14+; older kernels answer EINVAL, a no-op)
_POPULATE_WRITE = 23
_PAGE = mmap.PAGESIZE


def populate(t: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    """Fault in a fresh CPU buffer's pages before it is written, split over ``threads`` (default: torch's
    intra-op thread count; nothing at one thread) threads of one kept pool, each ``madvise(MADV_POPULATE_WRITE)``
    on its own 2 MiB-aligned share (ctypes calls release the GIL, so the shares fault at once). A buffer's first write otherwise
    takes its page faults inside the operation that writes it: a block of 2,048 result rows is one
    2 MiB page, faulted (and zeroed) by one thread while the other waits, so at two threads the map with
    fresh results ran at 1.36x its floor against 1.06x with its results already touched (BENCHMARKS.md,
    "Issue 35: two threads, 32K settled"). The contents are unchanged (zeros or what was there); elsewhere (no libc,
    another device, a kernel without the advice) nothing happens. Returns ``t``."""
    nbytes = t.numel() * t.element_size()
    threads = threads or torch.get_num_threads()
    if t.device.type != "cpu" or nbytes < HUGE_PAGE_MIN or threads < 2:
        return t  # one thread takes the faults in the GEMM as fast (2-4% slower up front, measured)
    madvise = _libc_madvise()
    if madvise is None or _MADVISE.get("populate") is False:
        return t
    start = -(-t.data_ptr() // _PAGE) * _PAGE
    end = (t.data_ptr() + nbytes) // _PAGE * _PAGE
    n = max(1, min(threads, (end - start) // _HUGE))
    cuts = [start] + [(start + (end - start) * i // n) // _HUGE * _HUGE for i in range(1, n)] + [end]
    spans = [(a, b - a) for a, b in zip(cuts, cuts[1:]) if b > a]
    if not spans:  # no whole page inside the buffer
        return t
    try:  # the other shares on the pool's threads (ctypes calls release the GIL), the first here
        pool = thread_pool("kvbridge-populate", len(spans) - 1) if len(spans) > 1 else None
        jobs = [pool.submit(madvise, a, ln, _POPULATE_WRITE) for a, ln in spans[1:]] if pool else []
    except RuntimeError:  # no thread to be had: the other shares fault in where they are written
        jobs = []
    if madvise(*spans[0], _POPULATE_WRITE) != 0:
        import errno

        if ctypes.get_errno() == errno.EINVAL:  # a kernel without the advice: not asked again
            _MADVISE["populate"] = False
    for job in jobs:
        job.result()
    return t


def _libc_madvise():
    return libc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
