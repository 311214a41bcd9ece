"""Distributed fitting and resumable statistics.

Statistics are additive (see :mod:`kvbridge.fit.stats`), so a fit parallelises over the
corpus: under ``torchrun --nproc-per-node N -m kvbridge fit ...`` (or any launcher that sets
``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT``, or an already initialised
process group) rank ``r`` reads sequences ``r, r + N, r + 2N, ...``, accumulates its own
statistics, and :func:`kvbridge.fit.stats.all_reduce` sums them (gloo on CPU, nccl when CUDA
is available). Every rank then solves the same small systems; rank 0 writes the artifact.
The observations are exactly those of a single-process fit (sampling is seeded per sequence,
not per rank), so the mapping agrees with it up to float64 summation order.

:class:`Checkpoint` makes a fit resumable. It exists only when asked for (``--resume``; the
folder is ``.<out>.fitstate/`` beside ``--out``, removed when the fit succeeds). After batches
each rank writes its statistics and the number of batches done to
``<folder>/<pass>.rank<r>of<N>.safetensors`` (temp file + fsync + rename: never half-written;
one file per pass and rank, replaced in place, so the folder never grows). Checkpoint I/O is
bounded: at most one write every ``every_s`` seconds (default 60, ``KVBRIDGE_CHECKPOINT_EVERY``)
and never more than :data:`MAX_IO_SHARE` of the run's wall time (after a write that took
``t`` seconds the next waits at least ``t / MAX_IO_SHARE``), plus one at the end of each pass.
Every checkpoint carries a sha256 over its statistics, its key and its batch count; ``--resume``
verifies it (a tampered or corrupt checkpoint is a one-line error, never silently used),
checks the checkpoint was made by the same models, data, settings and world size (naming the
field that differs), and continues with the next batch. The result is bit-identical to an
uninterrupted fit (same float64 statistics, same batch order).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbridge.errors import KVBridgeError

#: checkpoint writes may take at most this share of a fit's wall time
MAX_IO_SHARE = 0.05


class CheckpointError(KVBridgeError):
    """A checkpoint cannot be resumed (different fit, corrupt file)."""


@dataclass(frozen=True)
class Context:
    """Where this process stands in a distributed fit."""

    rank: int = 0
    world: int = 1
    group: Any = None
    backend: str = ""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(backend: str | None = None) -> Context | None:
    """The distributed context: an initialised process group, one started from the torchrun
    environment, or ``None`` for a single process."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
            return None
        if not dist.is_available():
            raise KVBridgeError(
                "WORLD_SIZE > 1 but torch.distributed is not available in this torch build",
                "run a single process or install a torch with distributed support",
            )
        dist.init_process_group(backend=backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    return Context(dist.get_rank(), dist.get_world_size(), None, dist.get_backend())


def barrier(ctx: Context | None) -> None:
    if ctx is not None and ctx.world > 1:
        import torch.distributed as dist

        dist.barrier(group=ctx.group)


class Checkpoint:
    """Per-rank checkpoints of a fit's statistics (see the module docstring)."""

    def __init__(self, folder: Path | str, key: dict, *, resume: bool = False, every_s: float = 60.0):
        self.folder = Path(folder)
        self.key = json.loads(json.dumps(key, sort_keys=True, default=str))
        self.resume = resume
        self.every_s = float(os.environ.get("KVBRIDGE_CHECKPOINT_EVERY") or every_s)  # unset or empty: every_s
        self._last = time.monotonic()
        self._gap = self.every_s  # grows when writes are slow (MAX_IO_SHARE)
        self.writes = 0

    def path(self, tag: str, rank: int, world: int) -> Path:
        return self.folder / f"{tag}.rank{rank}of{world}.safetensors"

    def restore(self, tag: str, jobs: list, *, rank: int = 0, world: int = 1) -> int:
        """Batches already done for ``tag`` (statistics loaded into ``jobs``), 0 when starting fresh."""
        if not self.resume:
            return 0
        path = self.path(tag, rank, world)
        if not path.is_file():
            others = sorted(p.name for p in self.folder.glob(f"{tag}.rank*.safetensors"))  # none without the folder
            if others:
                raise CheckpointError(
                    f"checkpoint {self.folder} was written by a different number of processes "
                    f"({others[0]}); this run has {world}",
                    "resume with the same --nproc-per-node, or start afresh without --resume",
                )
            return 0
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata() or {}
                tensors = {name: fh.get_tensor(name) for name in fh.keys()}
        except Exception as exc:  # noqa: BLE001 - any unreadable file is one error
            raise CheckpointError(
                f"{path} is not a readable checkpoint ({exc})", "delete it and start afresh"
            ) from None
        want = meta.get("sha256")
        got = _digest(tensors, meta.get("key", ""), meta.get("done", ""), meta.get("tag", ""))
        if not want or got != want:
            raise CheckpointError(
                f"checkpoint {path} failed its checksum (sha256 {got[:12]}... != recorded "
                f"{str(want)[:12]}...): it is corrupt or was modified",
                f"delete {self.folder} and start afresh",
            )
        diff = _first_diff(json.loads(meta.get("key", "{}")), self.key)
        if diff is not None:
            name, was, now = diff
            raise CheckpointError(
                f"checkpoint {path.name} was made for a different fit: field {name!r} is "
                f"{_short(was)} there, {_short(now)} now",
                "resume with the same models, corpus and options, or start afresh without --resume",
            )
        for j, job in enumerate(jobs):
            try:
                job.load_state_dict(tensors, prefix=f"job{j}.")
            except (KeyError, ValueError) as exc:
                raise CheckpointError(
                    f"checkpoint {path.name} does not match this fit's statistics ({exc})",
                    "start afresh without --resume",
                ) from None
        return int(meta.get("done", 0))

    def maybe_save(self, tag: str, jobs: list, *, done: int, total: int, rank: int = 0, world: int = 1) -> bool:
        now = time.monotonic()
        if not (done >= total or now - self._last >= self._gap):
            return False
        self.save(tag, jobs, done=done, rank=rank, world=world)
        took = time.monotonic() - now
        self._last = time.monotonic()
        self._gap = self.every_s if self.every_s <= 0 else max(self.every_s, took / MAX_IO_SHARE)  # 0: every batch
        return True

    def save(self, tag: str, jobs: list, *, done: int, rank: int = 0, world: int = 1) -> Path:
        from safetensors.torch import save_file

        from kvbridge.durable import commit_file

        self.folder.mkdir(parents=True, exist_ok=True)
        states = (job.state_dict(prefix=f"job{j}.") for j, job in enumerate(jobs))
        tensors = {k: v.detach().contiguous().cpu() for state in states for k, v in state.items()}
        path = self.path(tag, rank, world)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        key = json.dumps(self.key, sort_keys=True)
        meta = {"key": key, "done": str(done), "tag": tag, "sha256": _digest(tensors, key, str(done), tag)}
        try:
            save_file(tensors, str(tmp), metadata=meta)
            commit_file(tmp, lambda: os.replace(tmp, path))  # fsync, rename, fsync of the folder
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.writes += 1
        return path

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _digest(tensors: dict, key: str, done: str, tag: str) -> str:
    """sha256 over a checkpoint's key, batch count, tag and every tensor (name, dtype, shape, bytes)."""
    h = hashlib.sha256(json.dumps([key, done, tag]).encode())
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _first_diff(a: Any, b: Any, where: str = "") -> tuple | None:
    """``(dotted field, a's value, b's value)`` of the first leaf where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for name in sorted(set(a) | set(b)):
            got = _first_diff(a.get(name), b.get(name), f"{where}.{name}" if where else name)
            if got is not None:
                return got
        return None
    return None if a == b else (where or "(key)", a, b)


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def default_checkpoint_dir(out: Path | str) -> Path:
    """``.<out name>.fitstate`` next to the output folder."""
    out = Path(out)
    return out.parent / f".{out.name}.fitstate"
