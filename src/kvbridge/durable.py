"""Durable writes with one journal commit per artifact (the flush half of ``artifacts.py``).

An artifact is a temporary folder renamed into place. For the rename to never expose a half-written
file after a crash, every file's data must reach the disk before the rename is committed. The plain
way is one ``fsync`` per file, then one for the folder and one for its parent: each is a journal
commit and a disk-cache flush (~4 ms for a small file on the project's machine).

On Linux, where the file system keeps one ordered journal (ext4, XFS; :data:`ONE_COMMIT_FS`), it is
done with ONE ``fsync``:

1. the data of each file is written out and waited for with ``sync_file_range`` (no journal commit,
   no cache flush; while a big file is being written, :func:`start_writeback` starts this early, so
   the wait at the end is short);
2. the folder is renamed into place;
3. the parent folder is ``fsync``-ed: one commit, preceded by a cache flush, that makes durable the
   files' metadata (their sizes and extents, logged when their write-out finished, so in this or an
   earlier transaction) together with the rename. A crash before it leaves the old state.

Anywhere else (another OS, another file system, no ``sync_file_range``) :func:`commit_tree` falls
back to an ``fsync`` per file and per folder, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from pathlib import Path

#: file systems whose directory fsync commits a journal that orders every earlier metadata change
ONE_COMMIT_FS = frozenset({"ext4", "xfs"})
_WRITE = 2  # SYNC_FILE_RANGE_WRITE
_WAIT_ALL = 1 | 2 | 4  # WAIT_BEFORE | WRITE | WAIT_AFTER
_FS_OF_DEV: dict[int, str] = {}


@functools.cache
def libc_function(name: str, argtypes: tuple):
    """Linux libc's ``name`` taking ``argtypes`` and returning an int (``errno`` kept), or None elsewhere
    or where libc has no such function (``sync_file_range`` here, ``madvise`` in :mod:`kvbridge.buffers`)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):  # pragma: no cover - no such libc function
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


def _sync_file_range():
    return libc_function("sync_file_range", (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint))


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` of ``fd`` out now (returns at once)."""
    fn = _sync_file_range()
    if fn is not None:
        fn(fd, offset, length, _WRITE)


def fs_type(path: Path | str) -> str:
    """The file system type of ``path`` (``/proc/self/mountinfo``), or ``""`` where unknown."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return ""
    if dev in _FS_OF_DEV:
        return _FS_OF_DEV[dev]
    want = f"{os.major(dev)}:{os.minor(dev)}"
    kind = ""
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 2 and fields[2] == want and " - " in line:
                kind = line.split(" - ", 1)[1].split()[0]
    _FS_OF_DEV[dev] = kind
    return kind


def one_commit(folder: Path | str) -> bool:
    """Whether :func:`commit_tree` can make ``folder`` durable with one journal commit."""
    return _sync_file_range() is not None and fs_type(folder) in ONE_COMMIT_FS


def fsync_path(path: Path | str) -> None:
    """``fsync`` a file or folder (best effort where a file system refuses to open folders)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - some file systems refuse opening folders
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _flush_data(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _sync_file_range()(fd, 0, 0, _WAIT_ALL) != 0:  # 0, 0: the whole file
            err = ctypes.get_errno()
            raise OSError(err, f"sync_file_range: {os.strerror(err)}", str(path))
    finally:
        os.close(fd)


def commit_tree(tmp: Path, rename) -> None:
    """Make the folder (or single file) ``tmp`` durable and call ``rename()`` (which moves it into place).

    One journal commit where :func:`one_commit` holds (data of every file written out and waited
    for, rename, ``fsync`` of the parent); else ``fsync`` of every file and folder, rename, ``fsync``
    of the parent. A failure before ``rename()`` leaves ``tmp`` as it is (the caller removes it).
    """
    tmp = Path(tmp)
    flush = one_commit(tmp)
    for p in [*sorted(tmp.rglob("*")), tmp] if tmp.is_dir() else [tmp]:
        if flush and p.is_file() and not p.is_symlink():
            _flush_data(p)
        elif not flush and (p.is_file() or p.is_dir()):
            fsync_path(p)
    rename()
    fsync_path(tmp.parent)


#: a single temporary file: the same steps
commit_file = commit_tree
