"""Fault injection for reliability tests: fail or die at a named point, on demand.

``KVBRIDGE_FAULT=POINT:N[:ACTION]`` makes the N-th time (1-based) the code passes
``fault_point(POINT)`` raise :class:`InjectedFault` (``ACTION`` = ``raise``, the default) or
kill the process with SIGKILL (``kill``: no cleanup, no ``finally``, like a power cut).
Several specs may be given separated by commas. Points: ``fit.batch`` (after each
calibration batch and its checkpoint), ``fit.save`` (before the mapping is written),
``artifact.write`` (inside the temp folder, before the rename), ``eval.batch`` (after each
evaluated batch and its partial record), ``diverge.seed`` (after each seed).

Unset (always, outside tests) it costs one dictionary lookup per point.
"""

from __future__ import annotations

import os

_COUNTS: dict[str, int] = {}


class InjectedFault(RuntimeError):
    """Raised at a fault point named in ``KVBRIDGE_FAULT`` (tests only)."""


def _specs() -> list[tuple[str, int, str]]:
    out = []
    for part in filter(None, (p.strip() for p in os.environ.get("KVBRIDGE_FAULT", "").split(","))):
        bits = part.split(":")
        try:
            out.append((bits[0], int(bits[1]), bits[2] if len(bits) > 2 else "raise"))
        except (IndexError, ValueError):
            continue
    return out


def fault_point(name: str) -> None:
    """Count a pass through ``name``; fail here when ``KVBRIDGE_FAULT`` asks for it."""
    if "KVBRIDGE_FAULT" not in os.environ:
        return
    n = _COUNTS[name] = _COUNTS.get(name, 0) + 1
    for point, at, action in _specs():
        if point == name and at == n:
            if action == "kill":
                import signal

                os.kill(os.getpid(), signal.SIGKILL)
            raise InjectedFault(f"injected fault at {name} #{n} (KVBRIDGE_FAULT)")


def reset() -> None:
    _COUNTS.clear()
