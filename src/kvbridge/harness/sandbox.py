"""Run model-written Python in a separate, limited process (for HumanEval-style scoring).

Nothing runs unless the caller is inside :func:`code_execution_allowed` (the CLI enters it only
with ``--allow-code-execution``); outside it :func:`run_python` refuses with a one-line error.

What the child gets: a fresh temporary working folder (removed afterwards) holding only the
program; ``python -I -S`` (isolated mode: no ``PYTHON*`` variables, no user or site packages,
so only the standard library); an environment of ``PATH``, ``LANG`` and ``HOME`` (the temporary
folder) and nothing else inherited (no tokens or secrets from the parent's environment); its
own session (the whole process group is killed on timeout); resource limits set by a small
launcher in the child before the program is compiled and run: CPU seconds, address space, file
size, open files, no core dumps. Wall-clock timeout on top.

This is a guard against accidents (runaway loops, memory blow-ups, stray files), **not** a
security boundary: the child can still read files the user can read and reach the network.
Run untrusted models' code inside a container or VM.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvbridge.harness.protocol import HarnessError

_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("kvbridge_code_execution", default=False)


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock
    cpu_s: int = 10  # RLIMIT_CPU
    memory_mb: int = 1024  # RLIMIT_AS
    file_mb: int = 16  # RLIMIT_FSIZE
    open_files: int = 64  # RLIMIT_NOFILE


@dataclass(frozen=True)
class RunResult:
    passed: bool
    returncode: int | None
    timed_out: bool
    stderr_tail: str


@contextlib.contextmanager
def code_execution_allowed():
    """Inside this block :func:`run_python` runs programs; outside it refuses."""
    token = _ALLOWED.set(True)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def execution_allowed() -> bool:
    return _ALLOWED.get()


#: what the child runs first: its own resource limits (no preexec_fn: the parent may hold threads), then the program
LAUNCHER = """\
import resource, sys
path, cpu, mem, fsize, nfiles = sys.argv[1], *(int(x) for x in sys.argv[2:6])
for what, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize),
                    (resource.RLIMIT_NOFILE, nfiles), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(what, (value, value))
sys.argv = [path]
with open(path, encoding="utf-8") as fh:
    code = compile(fh.read(), path, "exec")
del resource, fh, what, value
exec(code, {"__name__": "__main__", "__file__": path})
"""


def run_python(program: str, limits: Limits = Limits()) -> RunResult:
    """Run ``program`` (Python source) in the sandbox; ``passed`` is exit status 0 within the limits."""
    if not execution_allowed():
        raise HarnessError(
            "running model-generated code is not allowed",
            "pass --allow-code-execution (the code runs in a limited subprocess, not a container)",
        )
    if os.name != "posix":  # pragma: no cover - resource limits are POSIX
        raise HarnessError("code execution needs a POSIX system (resource limits)", "run on Linux or macOS")
    with tempfile.TemporaryDirectory(prefix="kvbridge-exec-") as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(program, encoding="utf-8")
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tmp}
        mb = 1024 * 1024
        sizes = (int(limits.cpu_s), int(limits.memory_mb) * mb, int(limits.file_mb) * mb, int(limits.open_files))
        cmd = [sys.executable, "-I", "-S", "-c", LAUNCHER, str(path), *map(str, sizes)]  # LAUNCHER's argv
        proc = subprocess.Popen(
            cmd,
            cwd=tmp,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        try:
            _, err = proc.communicate(timeout=limits.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            timed_out = True
        tail = (err or b"").decode("utf-8", "replace")[-500:]
        return RunResult(proc.returncode == 0 and not timed_out, proc.returncode, timed_out, tail)
