"""Two model references checked: :func:`check_models` resolves them, builds each
:class:`~kvbridge.check.compat.Side` from its files (config, tokenizer fingerprint, weight digest) and
runs the config-only check (:func:`kvbridge.check.compat.check`), with kvbridge's measured verdicts
on that very pair. It lives with the models because it resolves references; ``check/`` stays below
them (configs and specs only)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvbridge.check.compat import Report, Side, check
from kvbridge.errors import ConfigError
from kvbridge.plugins import host_or_default


def check_models(source, target, *, host=None, source_tokenizer=None, target_tokenizer=None) -> Report:
    """Check two model references (anything :func:`kvbridge.models.resolve` takes, or ModelRefs).

    ``source_tokenizer`` / ``target_tokenizer`` override the tokenizer: a folder or a list of
    tokenizer files, or a :class:`~kvbridge.check.tokenizer_fp.TokenizerFingerprint`.
    """
    from kvbridge.models import resolve

    host = host_or_default(host)
    src, tgt = resolve(source, host=host), resolve(target, host=host)
    same = src.path == tgt.path and src.config == tgt.config
    s_tok = _tokenizer_override(source_tokenizer, "--source-tokenizer") if source_tokenizer is not None else None
    t_tok = _tokenizer_override(target_tokenizer, "--target-tokenizer") if target_tokenizer is not None else None
    report = check(
        Side.of(src, host=host, tokenizer=s_tok, weights=not same),
        Side.of(tgt, host=host, tokenizer=t_tok, weights=not same),
        host=host,
        same_model=same,
    )
    from kvbridge.check.measured import measured_for, names_of

    return replace(report, measured=tuple(measured_for(names_of(src), names_of(tgt))))


def _tokenizer_override(value, option: str):
    from kvbridge.check.tokenizer_fp import TokenizerFingerprint, find_tokenizer_files, fingerprint_files

    if isinstance(value, TokenizerFingerprint):
        return value
    if isinstance(value, (list, tuple)):
        return fingerprint_files([Path(v) for v in value])
    path = Path(value).expanduser()
    if path.is_dir():
        files = find_tokenizer_files(path)
        if not files:
            raise ConfigError(
                f"{path}: no tokenizer files (tokenizer.json, vocab.json or tokenizer.model)",
                f"pass {option} a folder or file of the model's tokenizer",
            )
        return fingerprint_files(files)
    if path.is_file():  # this file, the folder's non-vocabulary files, and a vocab.json's merges.txt
        vocabularies = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model")
        files = [path, *(p for p in find_tokenizer_files(path.parent) if p.name not in vocabularies)]
        merges = path.parent / "merges.txt"
        return fingerprint_files(files + ([merges] if path.name == "vocab.json" and merges.is_file() else []))
    raise ConfigError(f"{path}: no such file or directory", f"pass {option} a tokenizer folder or file")
