"""Campaign, class "resume state": checkpoints exist only with --resume, carry checksums that
are verified (tampering is a one-line error), bound their I/O, and a resumed fit is
bit-identical to an uninterrupted one."""

from __future__ import annotations

import json

import pytest


def _tensors(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "mapping.safetensors"))


def _interrupted(world, out, c, monkeypatch, at: int = 2):
    monkeypatch.setenv("KVBRIDGE_CHECKPOINT_EVERY", "0")  # a checkpoint after every batch
    monkeypatch.setenv("KVBRIDGE_FAULT", f"fit.batch:{at}")
    args = world.fit_args(out, "--resume", "--batch-size", "2")
    c.error(c.cli(args), "injected fault", code=3)
    monkeypatch.delenv("KVBRIDGE_FAULT")
    ck = out.parent / f".{out.name}.fitstate"
    assert not out.exists() and ck.is_dir() and list(ck.glob("*.safetensors"))
    return args, ck


def test_resume_is_bit_identical(world, tmp_path, c, monkeypatch):
    full = tmp_path / "full"
    res = c.cli(world.fit_args(full, "--batch-size", "2"))
    assert res.exit_code == 0, res.output
    out = tmp_path / "resumed"
    args, ck = _interrupted(world, out, c, monkeypatch, at=2)
    meta = _meta(next(ck.glob("*.safetensors")))
    assert int(meta["done"]) == 2  # the resume really starts midway
    res = c.cli(args)
    assert res.exit_code == 0, res.output
    a, b = _tensors(full), _tensors(out)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and bool((a[k] == b[k]).all()), k  # bitwise, not approximately
    assert not ck.exists() and not c.leftovers(tmp_path)


def _meta(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return fh.metadata()


@pytest.mark.parametrize("tamper", ["tensor-byte", "done-count", "key", "checksum", "truncate", "garbage"])
def test_tampered_checkpoint_is_refused(world, tmp_path, c, monkeypatch, tamper):
    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path / "m"
    args, ck = _interrupted(world, out, c, monkeypatch)
    path = next(ck.glob("*.safetensors"))
    meta = _meta(path)
    tensors = load_file(str(path))
    if tamper == "tensor-byte":  # a silently corrupted statistic, metadata untouched
        name = sorted(tensors)[3]
        t = tensors[name].clone()
        t.view(-1)[0] += 1e-3
        tensors[name] = t
        save_file(tensors, str(path), metadata=meta)
    elif tamper == "done-count":
        save_file(tensors, str(path), metadata={**meta, "done": "1"})
    elif tamper == "key":
        key = json.loads(meta["key"])
        key["world"] = 1
        key["extra"] = True
        save_file(tensors, str(path), metadata={**meta, "key": json.dumps(key, sort_keys=True)})
    elif tamper == "checksum":
        save_file(tensors, str(path), metadata={k: v for k, v in meta.items() if k != "sha256"})
    elif tamper == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.write_bytes(b"\x00" * 64)
    del torch
    c.error(c.cli(args), "checkpoint")
    assert not out.exists()


def test_checkpoint_of_another_fit_names_the_field(world, tmp_path, c, monkeypatch):
    out = tmp_path / "m"
    args, _ = _interrupted(world, out, c, monkeypatch)
    other = list(args)
    other[other.index("--top-k") + 1] = "2"
    c.error(c.cli(other), "top_k")


def test_checkpoint_io_is_bounded(tmp_path, monkeypatch):
    """60 s interval by default; slow writes stretch it to keep I/O under MAX_IO_SHARE of the run."""
    import time

    import torch

    from kvbridge.fit import distributed as d

    class Job:
        def state_dict(self, prefix=""):
            return {f"{prefix}x": torch.zeros(4)}

    monkeypatch.delenv("KVBRIDGE_CHECKPOINT_EVERY", raising=False)
    ck = d.Checkpoint(tmp_path / "ck", {"k": 1}, resume=True)
    for i in range(1, 201):
        ck.maybe_save("joint", [Job()], done=i, total=200)
    assert ck.writes == 1  # only the end of the pass, within a 60 s interval
    assert len(list((tmp_path / "ck").iterdir())) == 1  # one file per pass and rank, replaced in place

    ck = d.Checkpoint(tmp_path / "ck2", {"k": 1}, resume=True, every_s=0.001)
    real_save = ck.save

    def slow_save(*a, **k):
        time.sleep(0.02)
        return real_save(*a, **k)

    ck.save = slow_save
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.5:
        ck.maybe_save("joint", [Job()], done=1, total=10**9)
        time.sleep(0.001)
    assert ck.writes <= 3  # a 20 ms write may recur only every 20 / MAX_IO_SHARE = 400 ms


def test_no_resume_state_without_resume(world, tmp_path, c, monkeypatch):
    monkeypatch.setenv("KVBRIDGE_CHECKPOINT_EVERY", "0")
    res = c.cli(world.fit_args(tmp_path / "m"))
    assert res.exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
