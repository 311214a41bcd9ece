"""The tiny model zoo: small Llama models trained by this project, shipped as package data.

Five models share one byte-level BPE tokenizer trained on the public-domain tiny-Shakespeare
corpus (the corpus itself is never shipped; the build, ``python -m tools.zoo.build`` in a
checkout, reads it from ``../shared/corpora/`` or ``--corpus PATH``):

* ``base``: the reference model;
* ``wide``: same KV-head count and head dim, different depth, width and RoPE theta;
* ``odd``: a different KV geometry (KV-head count and head dim);
* ``tuned``: ``base`` trained further on a disjoint slice (the fine-tune case);
* ``stranger``: ``base``'s architecture from another seed (a negative control).

This module imports neither torch nor transformers: :func:`read_manifest`, :func:`zoo_dir` and
:data:`ZOO_NAMES` are cheap. Loading is ``kvbridge.models.load("zoo:NAME")`` (``load_zoo_model``: the same).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvbridge.errors import ArtifactError, ConfigError

#: the zoo's model names, in build order (``tools/zoo/recipes.py`` builds them; a test checks the two agree)
ZOO_NAMES: tuple[str, ...] = ("base", "wide", "odd", "tuned", "stranger")
#: named contiguous slices of the corpus, as (start, end) fractions of its characters (cut at line
#: starts): ``base`` trains every model but ``tuned`` (and the tokenizer), ``tune`` trains ``tuned``
#: on from ``base``, ``heldout`` is never trained on
SPLITS: dict[str, tuple[float, float]] = {"base": (0.0, 0.75), "tune": (0.75, 0.9), "heldout": (0.9, 1.0)}
#: the corpus the shipped zoo was built from (``../shared/corpora/`` beside the repo)
CORPUS_NAME = "tinyshakespeare.txt"
#: environment variable naming another zoo folder (e.g. one ``python -m tools.zoo.build --out`` wrote)
ZOO_DIR_ENV = "KVBRIDGE_ZOO_DIR"
MANIFEST = "manifest.json"
#: the fix named when the shipped zoo is missing
REBUILD = "reinstall kvbridge with its package data (or, in a checkout: python -m tools.zoo.build --corpus PATH)"
TOKENIZER_DIR = "tokenizer"


def zoo_dir() -> Path:
    """The folder holding the zoo: ``$KVBRIDGE_ZOO_DIR`` if set, else the package's ``zoo/models``."""
    env = os.environ.get(ZOO_DIR_ENV)
    return Path(env) if env else Path(__file__).resolve().parent / "models"


def default_corpus() -> Path:
    """``$KVBRIDGE_SHARED/corpora/tinyshakespeare.txt``, else ``../shared/corpora/`` beside the repo."""
    shared = os.environ.get("KVBRIDGE_SHARED")
    base = Path(shared) if shared else Path(__file__).resolve().parents[3].parent / "shared"
    return base / "corpora" / CORPUS_NAME


def split_text(text: str, split: str) -> str:
    """The named split (:data:`SPLITS`) of the corpus text."""
    from kvbridge.corpus import slice_text

    return slice_text(text, *SPLITS[split])


def model_dir(name: str, root: Path | None = None) -> Path:
    """The ``save_pretrained`` folder of one zoo model (config, fp16 safetensors, tokenizer files)."""
    folder = Path(root or zoo_dir()) / name
    if name not in ZOO_NAMES and not (folder / "config.json").is_file():
        raise ConfigError(f"no zoo model {name!r}", f"use one of: {', '.join(ZOO_NAMES)}")
    return folder


def read_manifest(root: Path | None = None) -> dict:
    """The zoo's ``manifest.json`` (recipe hashes, corpus sha256, losses, file sha256s)."""
    path = Path(root or zoo_dir()) / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"zoo manifest not found at {path}", REBUILD)
    return json.loads(path.read_text(encoding="utf-8"))


__all__ = [
    "ZOO_NAMES",
    "ZOO_DIR_ENV",
    "SPLITS",
    "CORPUS_NAME",
    "zoo_dir",
    "model_dir",
    "read_manifest",
    "default_corpus",
    "split_text",
]
