"""``ModelRef``: a model reference resolved to its config, files and identity (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvbridge.errors import ConfigError

#: how a reference was found
KINDS = ("dir", "config", "gguf", "hf-cache", "manifest", "zoo", "known", "plugin")


@dataclass(frozen=True)
class ModelRef:
    """A model reference resolved to a config mapping and, where known, its files.

    ``kind`` says how it was found (:data:`KINDS`); ``folder`` holds the weights and tokenizer
    files when there are any (a manifest record has none); ``gguf_file`` is the ``.gguf`` file
    of a GGUF reference (its header in ``gguf``); ``source`` names the scheme or short name that
    produced it (``zoo``, ``smollm2``, a plugin scheme), empty for plain paths.
    """

    ref: str  # what the user passed
    kind: str  # one of KINDS
    name: str  # display name: manifest id, hub id, short name, or folder / file name
    config: dict = field(hash=False)  # the parsed config.json (or derived from a manifest / GGUF header)
    path: str  # the file the config came from (config.json, manifest record, .gguf)
    folder: str | None = None  # the folder holding weights and tokenizer files, if any
    tokenizer_files: tuple = ()  # tokenizer files found beside the config
    tokenizer_record: dict | None = field(default=None, hash=False)  # a manifest's fingerprint
    generation_config: dict | None = field(default=None, hash=False)  # generation_config.json
    manifest: dict | None = field(default=None, hash=False)  # the whole manifest record
    gguf_file: str | None = None  # the .gguf file of a GGUF reference
    gguf: object | None = field(default=None, hash=False, compare=False)  # its GGUFInfo header
    source: str = ""  # the scheme / short name that resolved it

    # -- what the reference has --------------------------------------------------------------
    @property
    def has_weights(self) -> bool:
        """Whether :func:`kvbridge.models.load` can load this reference."""
        return bool(self.weight_files())

    @property
    def quantization(self) -> str | None:
        """The GGUF quantization type (``Q4_1`` ...), None for other references."""
        return self.gguf.quantization if self.gguf is not None else None

    def weight_files(self) -> list[Path]:
        if self.gguf_file:
            return [Path(self.gguf_file)]
        from kvbridge.models.fingerprint import weight_files

        return weight_files(self.folder) if self.folder else []

    def weights_digest(self) -> str | None:
        """sha256 over every byte of the weight files (cached by size and mtime); None without weights."""
        from kvbridge.models.fingerprint import files_digest

        return files_digest(self.weight_files())

    def fingerprint(self) -> dict:
        """``{"weights", "config", "quantization", "files"}``: what identifies this model's files."""
        from kvbridge.models.fingerprint import config_fingerprint

        return {
            "weights": self.weights_digest(),
            "config": config_fingerprint(self.config),
            "quantization": self.quantization,
            "files": [p.name for p in self.weight_files()],
        }

    def tokenizer(self):
        """The :class:`~kvbridge.check.tokenizer_fp.TokenizerFingerprint`, or None when unknown."""
        from kvbridge.check.tokenizer_fp import TokenizerFingerprint, fingerprint_files

        if self.gguf is not None:
            from kvbridge.models.gguf_tokenizer import gguf_tokenizer_fingerprint

            return gguf_tokenizer_fingerprint(self.gguf)
        if self.tokenizer_files:
            return fingerprint_files([Path(p) for p in self.tokenizer_files])
        if self.tokenizer_record:
            try:
                return TokenizerFingerprint.from_dict(self.tokenizer_record)
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(
                    f"{self.path}: field 'tokenizer' is not a valid fingerprint ({exc})",
                    "recompute it with kvbridge.check.tokenizer_fp.fingerprint_dir",
                ) from None
        return None

    def spec(self, host=None):
        """The :class:`~kvbridge.spec.ModelSpec` of this model; errors name :attr:`path`."""
        from kvbridge.check.sources import describe_config

        return describe_config(self.config, where=self.path, host=host)

    def to_dict(self) -> dict:
        out = {name: getattr(self, name) for name in ("ref", "kind", "name", "path", "folder")}
        out["tokenizer_files"] = list(self.tokenizer_files)
        return out | {name: getattr(self, name) for name in ("gguf_file", "source") if getattr(self, name)}
