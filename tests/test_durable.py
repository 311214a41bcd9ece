"""The durable commit of an artifact: one journal commit where the file system orders it, an fsync
per file elsewhere; either way the data is flushed before the rename and the result is whole."""

from __future__ import annotations

import os

import pytest
import torch

import kvbridge.durable as durable
from kvbridge.artifacts import read_artifact, write_artifact, write_file_atomic


@pytest.fixture
def syscalls(monkeypatch):
    """Counts of fsync and of sync_file_range waits (whole-file flushes), by call."""
    seen = {"fsync": 0, "flush": []}
    real_fsync = os.fsync
    real_flush = durable._flush_data

    def fsync(fd):
        seen["fsync"] += 1
        return real_fsync(fd)

    def flush(path):
        seen["flush"].append(path.name)
        return real_flush(path)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(durable, "_flush_data", flush)
    return seen


def _tensors():
    return {"w": torch.randn(300, 500), "b": torch.randn(500), "n": torch.arange(7)}


def test_one_fsync_per_artifact_where_the_journal_orders_it(tmp_path, syscalls):
    if not durable.one_commit(tmp_path):
        pytest.skip(f"{durable.fs_type(tmp_path) or 'unknown'} file system or no sync_file_range: fsync per file")
    tensors = _tensors()
    out = write_artifact(tmp_path / "a", tensors, {"v": 1}, tensor_file="t.safetensors")
    assert syscalls["fsync"] == 1  # the parent, after the rename
    assert sorted(syscalls["flush"]) == sorted([".kvbridge-artifact.json", "manifest.json", "t.safetensors"])
    _, back = read_artifact(out)
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)
    syscalls["fsync"] = 0
    write_file_atomic(tmp_path / "p.json", "{}\n")
    assert syscalls["fsync"] == 1 and (tmp_path / "p.json").read_text() == "{}\n"


def test_other_file_systems_fsync_every_file_and_folder(tmp_path, syscalls, monkeypatch):
    monkeypatch.setattr(durable, "ONE_COMMIT_FS", frozenset())
    assert not durable.one_commit(tmp_path)
    out = write_artifact(tmp_path / "a", _tensors(), {"v": 1}, tensor_file="t.safetensors")
    # three files, the temp folder, the parent: as before this change
    assert syscalls["fsync"] == 5 and syscalls["flush"] == []
    assert read_artifact(out)[0]["v"] == 1
    syscalls["fsync"] = 0
    write_file_atomic(tmp_path / "p.json", "{}\n")
    assert syscalls["fsync"] == 2


def test_a_failed_flush_leaves_the_previous_artifact(tmp_path, monkeypatch):
    out = write_artifact(tmp_path / "a", {"x": torch.ones(3)}, {"v": 1}, tensor_file="t.safetensors")

    def broken(tmp, rename):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("kvbridge.artifacts.commit_tree", broken)
    with pytest.raises(OSError, match="Input/output"):
        write_artifact(out, {"x": torch.zeros(3)}, {"v": 2}, tensor_file="t.safetensors", overwrite=True)
    assert read_artifact(out)[0]["v"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_fs_type_names_the_mount_of_a_path(tmp_path):
    if not os.path.exists("/proc/self/mountinfo"):
        pytest.skip("no /proc/self/mountinfo")
    assert durable.fs_type(tmp_path)  # e.g. ext4, xfs, tmpfs, overlay
    assert durable.fs_type(tmp_path / "missing") == ""


def _save_in_child(path, queue):
    from kvbridge.artifacts import save_safetensors

    queue.put(save_safetensors({"x": torch.arange(4.0)}, path))


def test_a_forked_child_saves_with_its_own_checksum_thread(tmp_path):
    import multiprocessing

    from kvbridge.artifacts import save_safetensors, sha256_file

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    save_safetensors({"x": torch.arange(4.0)}, tmp_path / "parent.safetensors")  # the parent's thread exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_save_in_child, args=(str(tmp_path / "child.safetensors"), queue))
    child.start()
    child.join(60)
    assert child.exitcode == 0, "the child hung or failed saving"
    assert (
        queue.get(timeout=5)
        == sha256_file(tmp_path / "child.safetensors")
        == sha256_file(tmp_path / "parent.safetensors")
    )
