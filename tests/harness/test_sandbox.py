"""The code-execution sandbox: refused unless allowed; exit status, timeout, memory limit, clean environment."""

from __future__ import annotations

import pytest

from kvbridge.harness.protocol import HarnessError
from kvbridge.harness.sandbox import Limits, code_execution_allowed, run_python


def test_refused_unless_allowed():
    with pytest.raises(HarnessError, match="not allowed.*--allow-code-execution"):
        run_python("print(1)")


def test_status_timeout_memory_and_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBRIDGE_TEST_SECRET", "hunter2")
    with code_execution_allowed():
        assert run_python("assert 1 + 1 == 2\n").passed
        bad = run_python("assert 1 + 1 == 3\n")
        assert not bad.passed and "AssertionError" in bad.stderr_tail
        slow = run_python("while True:\n    pass\n", Limits(timeout_s=1.0, cpu_s=5))
        assert not slow.passed and slow.timed_out
        cpu = run_python("while True:\n    pass\n", Limits(timeout_s=20.0, cpu_s=1))
        assert not cpu.passed and not cpu.timed_out and cpu.returncode != 0  # SIGXCPU from RLIMIT_CPU
        big = run_python("x = bytearray(600 * 1024 * 1024)\n", Limits(memory_mb=256))
        assert not big.passed and "MemoryError" in big.stderr_tail
        env = run_python("import os, sys\nsys.exit(1 if 'KVBRIDGE_TEST_SECRET' in os.environ else 0)\n")
        assert env.passed
        cwd = run_python(
            f"import os\nassert os.getcwd() != {str(tmp_path)!r} and 'kvbridge-exec-' in os.getcwd()\n"
            "open('left.txt', 'w').write('x')\n"
        )
        assert cwd.passed
    assert not list(tmp_path.iterdir())
