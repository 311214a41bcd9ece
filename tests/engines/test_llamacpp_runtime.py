"""llama.cpp's binding is imported with OpenMP's waiting threads asleep (it shares torch's OpenMP
runtime), never over the user's policy, and too late once torch has loaded that runtime."""

from __future__ import annotations

import os
import subprocess
import sys


def _child(code: str, env_extra: dict) -> list[str]:
    prog = (
        "import os, sys\n" + code + "\nfrom kvbridge.errors import KVBridgeError\n"
        "from kvbridge.engines.llamacpp_runtime import binding\n"
        "try:\n    binding()\nexcept KVBridgeError:\n    pass  # no binding installed: the policy is set before the import\n"
        "print(os.environ.get('OMP_WAIT_POLICY'), 'llama_cpp' in sys.modules or 'no-binding')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env_extra
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, check=True).stdout
    return out.split()[:1]


def test_binding_sets_a_passive_wait_before_the_runtime_loads():
    assert _child("", {}) == ["PASSIVE"]


def test_binding_keeps_the_users_policy():
    assert _child("", {"OMP_WAIT_POLICY": "ACTIVE"}) == ["ACTIVE"]


def test_binding_changes_nothing_once_torch_loaded_the_runtime():
    assert _child("import torch", {}) == ["None"]
