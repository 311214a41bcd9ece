"""OpenMP's waiting threads sleep in commands that ask for it, set before torch loads, never over
the user's own policy."""

from __future__ import annotations

import os
import subprocess
import sys

import torch  # noqa: F401 - imported: the policy can no longer change in this process

from kvbridge.threads import passive_omp_wait


def _child(env_extra: dict) -> str:
    code = (
        "import os, sys; from kvbridge.threads import passive_omp_wait; r = passive_omp_wait(); "
        "print(r, os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env_extra
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_set_before_torch_loads_unless_the_user_chose():
    assert _child({}).split() == ["True", "PASSIVE", "False"]
    assert _child({"OMP_WAIT_POLICY": "ACTIVE"}).split() == ["False", "ACTIVE", "False"]


def test_too_late_once_torch_is_imported(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert passive_omp_wait() is False and "OMP_WAIT_POLICY" not in os.environ


def test_quiet_torch_sets_the_threads_and_quiets_transformers():
    from transformers.utils import logging as hf_logging

    from kvbridge.threads import quiet_torch

    threads, level = torch.get_num_threads(), hf_logging.get_verbosity()
    try:
        hf_logging.set_verbosity_info()
        quiet_torch(1)
        assert torch.get_num_threads() == 1 and hf_logging.get_verbosity() == hf_logging.ERROR
        quiet_torch(None)  # no count: the threads stay as they are
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
        hf_logging.set_verbosity(level)
