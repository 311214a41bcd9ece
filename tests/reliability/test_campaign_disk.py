"""Campaign, class "data destroyed / leftovers / file system": only an artifact of the same kind
that kvbridge wrote is ever replaced; a failed, refused or concurrent write leaves the previous
artifact byte-identical and no temp state; file-system errors are one line naming the path."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest


def _pack_args(world, out, *extra):
    return ["pack", "save", world.src, "--guide", world.guide, "--out", out, *extra]


WRITERS = {
    "fit": lambda w, out, *x: w.fit_args(out, *x),
    "pack": _pack_args,
}
FLAG = {"fit": "--force", "pack": "--overwrite"}


def _flag(cmd: str) -> str:
    """fit's replace flag (--force, being renamed --overwrite): whichever this checkout has."""
    if cmd != "fit":
        return FLAG[cmd]
    from kvbridge.cli.fit_cmd import fit

    names = {o for p in fit.params for o in p.opts}
    return "--overwrite" if "--overwrite" in names else "--force"


# -- ownership ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["fit", "pack"])
@pytest.mark.parametrize("use_flag", [False, True], ids=["plain", "overwrite"])
def test_never_replaces_a_model_folder(world, tmp_path, c, cmd, use_flag):
    victim = world.model_copy(tmp_path / "model")
    before = c.snap(victim)
    args = WRITERS[cmd](world, victim, *([_flag(cmd)] if use_flag else []))
    c.error(c.cli(args), str(victim))
    assert c.snap(victim) == before and not c.leftovers(tmp_path)


@pytest.mark.parametrize("cmd", ["fit", "pack"])
def test_never_replaces_a_foreign_folder(world, tmp_path, c, cmd):
    victim = tmp_path / "notes"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work")
    (victim / "manifest.json").write_text('{"kind": "not-kvbridge"}')
    before = c.snap(victim)
    c.error(c.cli(WRITERS[cmd](world, victim, _flag(cmd))), "did not write")
    assert c.snap(victim) == before


@pytest.mark.parametrize("cmd,other", [("fit", "pack"), ("pack", "mapping")])
def test_never_replaces_an_artifact_of_another_kind(world, scratch, c, cmd, other):
    victim = scratch / other
    before = c.snap(victim)
    line = c.error(c.cli(WRITERS[cmd](world, victim, _flag(cmd))), "refusing")
    assert "prefix-pack" in line or "mapping" in line
    assert c.snap(victim) == before and not c.leftovers(scratch)


@pytest.mark.parametrize("cmd", ["fit", "pack"])
def test_existing_same_kind_needs_the_flag(world, scratch, c, cmd):
    victim = scratch / ("mapping" if cmd == "fit" else "pack")
    before = c.snap(victim)
    c.error(c.cli(WRITERS[cmd](world, victim)), "already exists")
    assert c.snap(victim) == before


def test_pack_overwrite_replaces_a_pack(world, scratch, c):
    res = c.cli(_pack_args(world, scratch / "pack", "--overwrite"))
    assert res.exit_code == 0, res.output
    assert not c.leftovers(scratch)


@pytest.mark.parametrize("cmd", ["fit", "pack"])
def test_out_is_a_file(world, tmp_path, c, cmd):
    victim = tmp_path / "file.bin"
    victim.write_bytes(b"precious")
    c.error(c.cli(WRITERS[cmd](world, victim, _flag(cmd))), "is a file")
    assert victim.read_bytes() == b"precious"


@pytest.mark.parametrize("cmd", ["fit", "pack"])
def test_out_parent_is_a_file(world, tmp_path, c, cmd):
    parent = tmp_path / "file.bin"
    parent.write_bytes(b"precious")
    c.error(c.cli(WRITERS[cmd](world, parent / "out")), "file")
    assert parent.read_bytes() == b"precious"


@pytest.mark.parametrize("cmd", ["fit", "pack"])
@pytest.mark.parametrize("dangling", [True, False], ids=["dangling", "to-dir"])
def test_out_is_a_symlink(world, tmp_path, c, cmd, dangling):
    target = tmp_path / "elsewhere"
    if not dangling:
        target.mkdir()
        (target / "keep.txt").write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(target)
    c.error(c.cli(WRITERS[cmd](world, link, _flag(cmd))), "symbolic link")
    assert link.is_symlink() and (dangling or (target / "keep.txt").read_text() == "keep")


@pytest.mark.parametrize("cmd", ["fit", "pack", "eval"])
def test_read_only_location(world, tmp_path, c, cmd, monkeypatch):
    """EACCES / EROFS while creating the temp folder (simulated: the tests may run as root)."""
    import tempfile

    real = tempfile.mkdtemp

    def deny(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(k.get("dir", tmp_path)))

    monkeypatch.setattr(tempfile, "mkdtemp", deny)
    if cmd == "eval":
        args = [
            "eval",
            world.src,
            world.tgt,
            "--mapping",
            "identity",
            "--corpus",
            world.corpus,
            "--samples",
            2,
            "--prefix-len",
            8,
            "--continuation-len",
            2,
            "--greedy-tokens",
            2,
            "--bootstrap",
            0,
            "--report",
            tmp_path / "rep",
        ]
    else:
        args = WRITERS[cmd](world, tmp_path / "out")
    c.error(c.cli(args), "permission denied")
    monkeypatch.setattr(tempfile, "mkdtemp", real)
    left = c.leftovers(tmp_path)
    if cmd == "eval":  # the finished batches are kept (the report could not be written)
        assert [os.path.basename(p) for p in left] == ["rep.partial.jsonl"]
    else:
        assert not left
    assert not (tmp_path / "out").exists() and not (tmp_path / "rep").exists()


# -- disk full and failures midway ---------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["fit", "pack"])
def test_disk_full_keeps_the_previous_artifact(world, scratch, c, cmd, monkeypatch):
    import safetensors.torch as st

    victim = scratch / ("mapping" if cmd == "fit" else "pack")
    before = c.snap(victim)

    def full(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"\0" * 1000)  # a partial file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    def full_hashed(tensors, path, finite=False):  # the writer that hashes while it writes
        full(tensors, path)

    import kvbridge.artifacts

    monkeypatch.setattr(st, "save_file", full)
    monkeypatch.setattr(kvbridge.artifacts, "save_safetensors", full_hashed)
    c.error(c.cli(WRITERS[cmd](world, victim, _flag(cmd))), "no space left")
    assert c.snap(victim) == before and not c.leftovers(scratch)


@pytest.mark.parametrize("point", ["fit.batch:1", "fit.batch:2", "fit.save:1", "artifact.write:1"])
def test_fit_failing_midway_keeps_the_previous_mapping(world, scratch, c, monkeypatch, point):
    victim = scratch / "mapping"
    before = c.snap(victim)
    monkeypatch.setenv("KVBRIDGE_FAULT", point)
    c.error(c.cli(world.fit_args(victim, _flag("fit"))), "injected fault", code=3)
    assert c.snap(victim) == before and not c.leftovers(scratch)


def test_pack_failing_at_the_rename_keeps_the_previous_pack(world, scratch, c, monkeypatch):
    victim = scratch / "pack"
    before = c.snap(victim)
    monkeypatch.setenv("KVBRIDGE_FAULT", "artifact.write:1")
    c.error(c.cli(_pack_args(world, victim, "--overwrite")), "injected fault", code=3)
    assert c.snap(victim) == before and not c.leftovers(scratch)


@pytest.mark.parametrize("alpha", ["-1", "nan", "inf"])
def test_refused_fit_over_an_existing_mapping_changes_nothing(world, scratch, c, alpha):
    victim = scratch / "mapping"
    before = c.snap(victim)
    c.error(c.cli(world.fit_args(victim, _flag("fit"), "--alpha", alpha)), "--alpha")
    assert c.snap(victim) == before and not c.leftovers(scratch)


def test_failed_fit_without_resume_leaves_no_state(world, tmp_path, c, monkeypatch):
    monkeypatch.setenv("KVBRIDGE_FAULT", "fit.batch:2")
    monkeypatch.setenv("KVBRIDGE_CHECKPOINT_EVERY", "0")
    c.error(c.cli(world.fit_args(tmp_path / "m")), "injected", code=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- concurrent writers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["fit", "pack"])
def test_concurrent_writer_gets_a_lock_error(world, scratch, c, cmd):
    victim = scratch / ("mapping" if cmd == "fit" else "pack")
    before = c.snap(victim)
    code = (
        "import sys, time\nfrom kvbridge.artifacts import output_lock\n"
        f"with output_lock({str(victim)!r}):\n    print('locked', flush=True)\n    time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "locked"
        c.error(c.cli(WRITERS[cmd](world, victim, _flag(cmd))), "being written by another")
        assert c.snap(victim) == before
    finally:
        holder.kill()
        holder.wait()
    # the lock dies with its holder (even on SIGKILL): the next writer takes over and cleans up
    res = c.cli(WRITERS[cmd](world, victim, _flag(cmd)))
    assert res.exit_code == 0, res.output
    assert not c.leftovers(scratch)


def test_lock_is_reentrant_and_removed(tmp_path):
    from kvbridge.artifacts import lock_path, output_lock

    with output_lock(tmp_path / "x"):
        with output_lock(tmp_path / "x"):
            assert lock_path(tmp_path / "x").exists()
    assert not lock_path(tmp_path / "x").exists()


def test_crash_between_the_two_renames_is_recovered(world, scratch, c):
    """A writer killed after moving the old artifact aside: the next writer puts it back first."""
    victim = scratch / "pack"
    before = c.snap(victim)
    victim.rename(scratch / ".pack.old-12345")
    (scratch / ".pack.tmp-abc").mkdir()
    from kvbridge.artifacts import output_lock

    with output_lock(victim):
        pass
    assert c.snap(victim) == before and not c.leftovers(scratch)


def test_report_folder_replaces_only_a_report(world, tmp_path, c):
    victim = world.model_copy(tmp_path / "model")
    before = c.snap(victim)
    args = [
        "eval",
        world.src,
        world.tgt,
        "--mapping",
        "identity",
        "--corpus",
        world.corpus,
        "--samples",
        2,
        "--prefix-len",
        8,
        "--continuation-len",
        2,
        "--greedy-tokens",
        2,
        "--bootstrap",
        0,
        "--report",
        victim,
        "--no-attention",
    ]
    c.error(c.cli(args), "refusing")
    assert c.snap(victim) == before and not c.leftovers(tmp_path)


def test_artifact_permissions_follow_the_umask(world):
    mode = world.mapping.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o777 & ~umask


def test_write_artifact_is_atomic_under_kill(tmp_path):
    """kill -9 inside the temp folder (before the rename): the old artifact survives intact."""
    import torch

    from kvbridge.artifacts import read_artifact, write_artifact

    out = tmp_path / "a"
    write_artifact(out, {"x": torch.ones(3)}, {"kind": "test"}, tensor_file="t.safetensors")
    code = (
        "import torch\nfrom kvbridge.artifacts import write_artifact\n"
        f"write_artifact({str(out)!r}, {{'x': torch.zeros(3)}}, {{'kind': 'test'}}, "
        "tensor_file='t.safetensors', overwrite=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "KVBRIDGE_FAULT": "artifact.write:1:kill"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    assert res.returncode == -9
    _, tensors = read_artifact(out)
    assert torch.equal(tensors["x"], torch.ones(3))
    write_artifact(out, {"x": torch.zeros(3)}, {"kind": "test"}, tensor_file="t.safetensors", overwrite=True)
    assert torch.equal(read_artifact(out)[1]["x"], torch.zeros(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # the killed writer's temp folder was cleaned
    time.sleep(0)
