"""A loaded model pair: the currency of the stages that read one model's cache and write another's.

:func:`load_pair` resolves both references, checks that they share a tokenizer before any weight is
read (a refusal names ``check``'s reason), then loads both once. The :class:`ModelPair` keeps what
each :class:`~kvbridge.models.loading.LoadedModel` knows (reference, spec, fingerprint, tokenizer),
so a stage never looks it up again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from kvbridge.errors import ConfigError


@dataclass(frozen=True)
class ModelPair:
    """``source`` and ``target`` as :class:`~kvbridge.models.loading.LoadedModel`; ``tokenizer`` the
    fingerprint they share (a dict); ``tokenizer_note`` says how a partial match differs ("" when same)."""

    source: Any = field(repr=False)
    target: Any = field(repr=False)
    tokenizer: dict = field(hash=False)
    tokenizer_note: str = ""

    @property
    def names(self) -> tuple[str, str]:
        return self.source.name, self.target.name

    @property
    def same_model(self) -> bool:
        """Both sides are the same weights and config (an identity pair)."""
        return self.source.fingerprint == self.target.fingerprint


def is_ref(obj) -> bool:
    """A model reference (a name, a path, a :class:`~kvbridge.models.ModelRef`), not a loaded model."""
    from kvbridge.models.ref import ModelRef

    return isinstance(obj, (str, PathLike, ModelRef))


def shared_tokenizer(src, tgt) -> tuple[dict, str]:
    """``(fingerprint, note)`` of the tokenizer two resolved references share, or a one-line refusal
    with ``check``'s reason; ``note`` describes a partial match (added tokens, BOS handling)."""
    from kvbridge.check.tokenizer_fp import compare

    fps = []
    for role, ref in (("source", src), ("target", tgt)):
        fp = ref.tokenizer()
        if fp is None:
            raise ConfigError(
                f"{role} {ref.ref}: no tokenizer files found in {ref.folder or ref.path}",
                "a model pair needs both tokenizers to check the token ids agree",
            )
        fps.append(fp)
    verdict, action = compare(*fps)
    if verdict == "blocking":
        raise ConfigError(
            f"the tokenizers of {src.ref} and {tgt.ref} differ: {action}",
            "use models that share a tokenizer (see `kvbridge check`)",
        )
    return fps[0].to_dict(), ("" if verdict == "same" else action)


def _files_of(ref) -> Path | None:
    """The resolved GGUF file or folder ``ref`` loads from (None for a zoo or config model)."""
    p = ref.gguf_file or ref.folder
    return Path(p).resolve() if p else None


def load_pair(
    source, target, *, dtype: str | None = None, device: str = "cpu", target_tokenizer: bool = True, host=None
) -> ModelPair:
    """Resolve, check the shared tokenizer, then load both (``source``/``target``: references, already
    resolved :class:`~kvbridge.models.ModelRef` s, or :class:`~kvbridge.models.loading.LoadedModel` s,
    kept as they are)."""
    from kvbridge.models.loading import load
    from kvbridge.models.ref import ModelRef
    from kvbridge.models.resolve import resolve

    def ref_of(side):
        if hasattr(side, "fingerprint"):  # a LoadedModel
            return side.ref
        return side if isinstance(side, ModelRef) else resolve(side, host=host)

    src, tgt = ref_of(source), ref_of(target)
    fingerprint, note = shared_tokenizer(src, tgt)  # before any weights are read
    loaded_src = source if hasattr(source, "fingerprint") else load(src, dtype=dtype, device=device, host=host)
    if hasattr(target, "fingerprint"):
        return ModelPair(loaded_src, target, fingerprint, note)
    here, there = (_files_of(r) for r in (src, tgt))
    if here is not None and here == there:  # the same files on both sides (an identity pair): loaded once, shared
        return ModelPair(loaded_src, loaded_src, fingerprint, note)
    loaded_tgt = load(tgt, dtype=dtype, device=device, tokenizer=target_tokenizer, host=host)
    return ModelPair(loaded_src, loaded_tgt, fingerprint, note)
