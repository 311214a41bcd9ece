"""Shared timing loop for the start-up benches: alternating fresh-process runs of each command."""

from __future__ import annotations

import resource
import subprocess
import time


def time_commands(
    cmds: dict[str, list[str]],
    repeats: int,
    *,
    env: dict[str, str] | None = None,
    ok: tuple[int, ...] = (0,),
    warm: bool = False,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run every command `repeats` times, alternating between them, each in a fresh process.

    Returns (wall seconds, child user+sys CPU seconds) per command name. With `warm`, each
    command runs once first (untimed) to warm the OS file cache. An exit status not in `ok`
    stops the bench with the command's stderr tail.
    """
    times: dict[str, list[float]] = {k: [] for k in cmds}
    cpu: dict[str, list[float]] = {k: [] for k in cmds}  # user+sys of the child: robust to a busy machine
    if warm:
        for cmd in cmds.values():
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(repeats):
        for name, cmd in cmds.items():
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
            times[name].append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
            if proc.returncode not in ok:
                raise SystemExit(f"{name} failed ({proc.returncode}): {proc.stderr.decode()[-400:]}")
    return times, cpu
