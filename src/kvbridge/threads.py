"""Thread settings that must be made before torch is imported.

torch's CPU build runs its parallel regions on OpenMP (libgomp), whose threads spin at every
barrier while they wait (``OMP_WAIT_POLICY`` unset: ``ACTIVE``-like spinning). On a machine
with more runnable threads than cores, a spinning thread holds the core its partner needs, and
every small operation (a one-token decode step is hundreds of them) waits a scheduler slice:
with two torch threads on two cores shared with other jobs (load average ~10-14), a
SmolLM2-135M decode step took 1.4-2.2 s against 0.2-0.3 s with the waiting threads sleeping
(``OMP_WAIT_POLICY=PASSIVE``), a 512-token prefill 26-28 s against 5.7-6.0 s
(BENCHMARKS.md, "Task runs"). The policy decides only how threads wait, not how work is split:
results are bitwise the same.

:func:`thread_pool` keeps kvbridge's own worker threads (the checksum of a save, the native RoPE
kernel's row split): started once per process, not once per call. :func:`quiet_torch`: what a command
line sets once it is about to run a model (``kvbridge eval``, ``harness``, ``python -m kvbridge.adapters.pair``).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

_POOLS: dict = {}


def passive_omp_wait() -> bool:
    """Make OpenMP's waiting threads sleep instead of spin (``OMP_WAIT_POLICY=PASSIVE``), unless the
    user set a policy. Read once, when torch loads its OpenMP runtime: returns False (and changes
    nothing) when torch is already imported or a policy is set."""
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def thread_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """The pool of ``workers`` threads named ``name`` of this process (a forked child, which has no copy
    of the threads, starts its own); asked for another number of workers, it is replaced."""
    pool, n = _POOLS.get((name, os.getpid()), (None, 0))
    if n != workers:
        if pool is not None:
            pool.shutdown(wait=False)
        pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
        _POOLS[name, os.getpid()] = (pool, workers)
    return pool


def quiet_torch(threads: int | None) -> None:
    """Before a model runs: transformers' logging quiet, torch on ``threads`` threads (None or 0: torch's choice)."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if threads:
        torch.set_num_threads(int(threads))
