"""Progress of long runs (``eval``, ``diverge``) and their partial results.

:class:`Progress` prints to stderr: on a terminal one line redrawn in place (done/total,
tokens/s, ETA); otherwise (a log file, CI) a plain line at most every
:data:`PLAIN_EVERY_S` seconds (``KVBRIDGE_PROGRESS_EVERY``) and at the end, so logs stay
readable. Disabled, it prints nothing.

:class:`Heartbeat` is the same plain line for commands whose steps are long and few (model
loading, a fit's forwards): a background thread prints the current stage every few seconds.

:class:`PartialLog` keeps what a run has finished: a JSONL file (a header record with the
run's settings, then one record per finished unit of work) rewritten atomically after each
unit (temp file + fsync + rename, :func:`kvbridge.artifacts.write_file_atomic`), so a run
killed at any point leaves a complete, parseable file with every unit that finished.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from kvbridge.artifacts import write_file_atomic
from kvbridge.errors import ArtifactError

#: seconds between plain (non-terminal) progress lines
PLAIN_EVERY_S = 10.0


def _fmt_secs(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """``update(done, tokens=...)`` after each unit; ``close()`` at the end."""

    def __init__(
        self,
        total: int,
        *,
        label: str,
        unit: str = "samples",
        enabled: bool = True,
        stream: TextIO | None = None,
        tty: bool | None = None,
        every: float | None = None,
    ):
        self.total, self.label, self.unit, self.enabled = int(total), label, unit, enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every = float(every if every is not None else os.environ.get("KVBRIDGE_PROGRESS_EVERY") or PLAIN_EVERY_S)
        self.t0 = time.perf_counter()
        self._last = -1e9
        self.done = self.tokens = self.lines = 0

    def line(self) -> str:
        secs = max(time.perf_counter() - self.t0, 1e-9)
        rate = f", {self.tokens / secs:,.0f} tok/s" if self.tokens else ""
        eta = f", ETA {_fmt_secs(secs * (self.total - self.done) / self.done)}" if 0 < self.done < self.total else ""
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return f"{self.label}: {self.done}/{self.total} {self.unit} ({pct:.0f}%), {_fmt_secs(secs)} elapsed{rate}{eta}"

    def update(self, done: int, *, tokens: int = 0) -> None:
        self.done = int(done)
        self.tokens += int(tokens)
        if not self.enabled:
            return
        now = time.perf_counter()
        final = self.done >= self.total
        if self.tty:
            self._write("\r\033[K" + self.line() + ("\n" if final else ""))
        elif final or now - self._last >= self.every:
            self._last = now
            self._write(self.line() + "\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
        self.lines += 1

    def close(self, *, complete: bool = False) -> None:
        """End the line; ``complete=True`` first moves it to ``total`` (a count that rounds down reaches 100%)."""
        if complete and self.done < self.total:
            self.update(self.total)
        if self.enabled and self.tty and 0 < self.done < self.total:
            self.stream.write("\n")
            self.stream.flush()


def pass_progress(enabled: bool = True, world: int = 1, heartbeat=None):
    """The callback a fit reports its passes to (``("start" | "advance" | "end", tag, tokens)``): one
    :class:`Progress` per pass (tokens/s, ETA), the stage told to ``heartbeat`` (a :class:`Heartbeat`,
    plain lines for logs), and a summary line at the end of each pass (stderr; rank 0 only)."""
    note = f" (rank 0 of {world}; each rank reads 1/{world} of the corpus)" if world > 1 else ""
    state: dict = {}

    def on(event) -> None:
        kind, tag, n = event
        if not enabled:
            return
        if heartbeat is not None:
            if kind == "start":
                heartbeat.stage(f"{tag} forwards", max(1, n), "tokens")
            elif kind == "advance":
                heartbeat.advance(n)
            elif kind == "end":
                heartbeat.stage("solving and writing the mapping")
        bar = state.get("bar")
        if kind == "start":
            state["bar"] = Progress(max(1, n), label=tag, unit="tokens")
        elif kind == "advance" and bar is not None:
            bar.update(bar.done + n, tokens=n)
        elif kind == "end" and bar is not None:
            bar.close()
            state.pop("bar")
            secs = max(time.perf_counter() - bar.t0, 1e-9)
            rate = f"{bar.tokens / secs:,.0f} tok/s"
            print(f"{tag}: {bar.tokens:,} tokens through both models in {secs:.1f} s ({rate}){note}", file=sys.stderr)

    return on


class Heartbeat(Progress):
    """The :class:`Progress` of a few long steps, as plain lines for logs: the stage, done/total and the elapsed time, every
    :data:`PLAIN_EVERY_S` seconds (``KVBRIDGE_PROGRESS_EVERY``) from a background thread, so a
    log shows life while one step (loading a model, one forward of a big batch) takes minutes;
    once the first line is out, every stage change is printed too. A command that ends (or
    fails) within the first interval prints nothing. On a terminal it prints nothing (the bars
    redraw in place there).

    ``with Heartbeat("fit") as hb: hb.stage("loading models"); ...; hb.stage("calibrate", total, "tokens");
    hb.advance(n)``.
    """

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        every: float | None = None,
        enabled: bool = True,
    ):
        super().__init__(0, label=label, unit="", stream=stream, tty=tty, every=every)
        # KVBRIDGE_PROGRESS_EVERY=0 asks :class:`Progress` for a line per update; no timed lines then
        self.enabled = enabled and not self.tty and self.every > 0
        self._t_stage = self.t0
        self.name, self.total = "starting", None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def line(self) -> str:
        now = time.perf_counter()
        count = ""
        if self.total:
            count = f" {self.done:,}/{self.total:,} {self.unit} ({100.0 * self.done / self.total:.0f}%)".rstrip()
        elif self.done:
            count = f" {self.done:,} {self.unit}".rstrip()
        return (
            f"{self.label}: {self.name}{count}, {_fmt_secs(now - self.t0)} elapsed "
            f"({_fmt_secs(now - self._t_stage)} in this stage)"
        )

    def _emit(self) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._write(self.line() + "\n")

    def stage(self, name: str, total: int | None = None, unit: str = "") -> None:
        self.name, self.total, self.unit, self.done = name, total, unit, 0
        self._t_stage = time.perf_counter()
        if self._t_stage - self.t0 >= self.every:
            self._emit()

    def advance(self, n: int = 1) -> None:
        self.done += int(n)

    def set(self, done: int) -> None:
        self.done = int(done)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._emit()

    def __enter__(self) -> "Heartbeat":
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"kvbridge-{self.label}-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class PartialLog:
    """A JSONL file of finished units, rewritten atomically after each (see the module docstring)."""

    def __init__(self, path: Path | str, header: dict):
        self.path = Path(path)
        if self.path.is_symlink() or self.path.is_dir():
            raise ArtifactError(
                f"{self.path} is a folder or a symbolic link, not a partial-results file",
                "choose another --partial path",
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[dict] = [{"record": "header", "complete": False, **header}]
        self._flush()

    def add(self, record: dict) -> None:
        self.records.append({"record": "unit", **record})
        self._flush()

    def finish(self, summary: dict | None = None) -> None:
        self.records[0]["complete"] = True
        if summary is not None:
            self.records.append({"record": "summary", **summary})
        self._flush()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def _flush(self) -> None:
        write_file_atomic(self.path, "".join(json.dumps(json_ready(r), allow_nan=False) + "\n" for r in self.records))


def json_ready(obj: Any, *, stringify: bool = True):
    """JSON-ready: tensors/arrays -> lists, tuples -> lists, NaN/inf -> None, dict keys -> str.

    Other objects become ``str`` (``stringify=False`` leaves them as they are: the evaluation
    results, which the caller may still serialise with ``default=str``).
    """
    if hasattr(obj, "tolist"):
        obj = obj.tolist()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_ready(v, stringify=stringify) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v, stringify=stringify) for v in obj]
    if not stringify or obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def read_partial(path: Path | str) -> list[dict]:
    """The records of a partial-results file (every line is complete: it is written atomically)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
