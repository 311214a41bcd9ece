"""Opening a tokenizer offline for exact-token splits: a model or tokenizer folder, a
``tokenizer.json``, a ``vocab.json`` + ``merges.txt`` folder or a SentencePiece ``tokenizer.model``
(:func:`load_tokenizer`; used by the loader and the ``--tokenizer`` option).
"""

from __future__ import annotations

from pathlib import Path

from kvbridge.errors import ConfigError
from kvbridge.models.hf_loader import quiet_transformers, refuse_remote_code, tokenizer_from_pretrained
from kvbridge.paths import cache_read as json_object  # a file's JSON object; {} when missing or unreadable


class TokenizerError(ConfigError):
    """A tokenizer path cannot be opened (unknown layout, unreadable or unsupported files)."""


def _from_sentencepiece(model_file: Path, config: dict | None = None):
    """A fast Llama-style tokenizer from a SentencePiece BPE ``tokenizer.model``, no sentencepiece.

    The protobuf is parsed by :func:`kvbridge.check.tokenizer_fp.parse_sentencepiece`; BPE merges are
    derived from the piece scores (as transformers' converter does), byte fallback and the
    ``"▁"`` dummy prefix as in Llama/Mistral. Checked against Mistral's published
    ``tokenizer.json`` (same ids on 3,100 strings). Unigram models need ``sentencepiece``.
    """
    from tokenizers import AddedToken

    from kvbridge.check.tokenizer_fp import parse_sentencepiece

    transformers = quiet_transformers()
    from transformers.tokenization_utils_base import generate_merges

    sp = parse_sentencepiece(model_file)
    if sp["model_type"] != "bpe":
        raise TokenizerError(
            f"{model_file}: SentencePiece {sp['model_type']} models are not converted without "
            "the sentencepiece package",
            "install sentencepiece, or pass a folder with the model's tokenizer.json",
        )
    pieces = sp["pieces"]
    vocab = {piece: i for i, (piece, _score, _type) in enumerate(pieces)}
    merges = generate_merges(vocab, {piece: score for piece, score, _type in pieces})

    def piece(idx: int, default: str) -> str:
        return pieces[idx][0] if 0 <= idx < len(pieces) else default

    cfg = dict(config or {})
    kwargs = {"add_bos_token": True, "add_eos_token": False, "legacy": False, "add_prefix_space": True}
    kwargs |= {k: cfg[k] for k in kwargs if k in cfg}
    tok = transformers.LlamaTokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=piece(sp["unk_id"], "<unk>"),
        bos_token=piece(sp["bos_id"], "<s>"),
        eos_token=piece(sp["eos_id"], "</s>"),
        **kwargs,
    )
    known = {tok.unk_token, tok.bos_token, tok.eos_token}
    extra = [AddedToken(p, special=(t == 3), normalized=False) for p, _s, t in pieces if t in (3, 4) and p not in known]
    if extra:
        tok.add_tokens(extra)
    tok.name_or_path = str(model_file.parent)
    return tok


def _special_roles(folder: Path) -> dict:
    """bos/eos/unk/pad contents from a sibling ``special_tokens_map.json`` / ``tokenizer_config.json``."""
    roles: dict = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        data = json_object(folder / name)
        for role in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = data.get(role)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                roles[role] = value
    return roles


def load_tokenizer(path: str | Path):
    """A transformers tokenizer for ``path``, offline.

    ``path`` may be a model or tokenizer folder (``save_pretrained`` output, ``tokenizer.json``,
    ``vocab.json`` + ``merges.txt``, ``tokenizer.model``), or a ``tokenizer.json``,
    ``vocab.json`` or ``tokenizer.model`` file. Anything else is a one-line :class:`TokenizerError`.
    """
    path = Path(path)
    if not path.exists():
        raise TokenizerError(
            f"tokenizer path {path} does not exist",
            "pass a model/tokenizer folder, a tokenizer.json or a tokenizer.model",
        )
    if path.is_file():
        folder, name = path.parent, path.name
        if name.endswith(".json") and name != "vocab.json":
            return _open_tokenizer_json(path)
        if name == "vocab.json" or name == "merges.txt":
            return _open_bpe_files(folder)
        if name.endswith(".model"):
            return _from_sentencepiece(path, json_object(folder / "tokenizer_config.json"))
        raise TokenizerError(
            f"{path} is not a tokenizer file", "pass a tokenizer.json, vocab.json (+ merges.txt) or tokenizer.model"
        )
    folder = path
    refuse_remote_code(folder)  # a folder naming its own tokenizer code is refused, never run nor bypassed
    names = {p.name for p in folder.iterdir()}
    errors: list[str] = []
    if names & {"tokenizer_config.json", "config.json"} and names & {"tokenizer.json", "vocab.json", "tokenizer.model"}:
        try:
            return tokenizer_from_pretrained(folder)  # quiets transformers' logging itself
        except Exception as exc:  # noqa: BLE001 - fall back to the file-level readers below
            errors.append(f"AutoTokenizer: {' '.join(str(exc).split())[:120]}")
    if "tokenizer.json" in names:
        return _open_tokenizer_json(folder / "tokenizer.json")
    if "vocab.json" in names and "merges.txt" in names:
        return _open_bpe_files(folder)
    if "tokenizer.model" in names:
        return _from_sentencepiece(folder / "tokenizer.model", json_object(folder / "tokenizer_config.json"))
    why = f" ({'; '.join(errors)})" if errors else ""
    raise TokenizerError(
        f"{folder} holds no tokenizer (no tokenizer.json, vocab.json + merges.txt or tokenizer.model){why}",
        "pass a model or tokenizer folder saved with save_pretrained, or a tokenizer.json",
    )


def _open_tokenizer_json(path: Path):
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
        raise TokenizerError(
            f"{path} is not a readable tokenizer.json ({' '.join(str(exc).split())[:120]})",
            "pass the model's published tokenizer.json",
        ) from None
    vocab = backend.get_vocab(with_added_tokens=True)
    roles = {k: v for k, v in _special_roles(path.parent).items() if v in vocab}
    tok = quiet_transformers().PreTrainedTokenizerFast(tokenizer_object=backend, **roles)
    tok.name_or_path = str(path.parent)
    return tok


def _open_bpe_files(folder: Path):
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    if not (vocab.is_file() and merges.is_file()):
        raise TokenizerError(
            f"{folder} has vocab.json but no merges.txt (or the reverse)",
            "put both files of the byte-level BPE tokenizer in one folder",
        )
    gpt2_fast = quiet_transformers().GPT2TokenizerFast
    try:
        tok = gpt2_fast(vocab=str(vocab), merges=str(merges))
    except Exception as exc:  # noqa: BLE001
        raise TokenizerError(
            f"{folder}: vocab.json/merges.txt are not a byte-level BPE tokenizer ({' '.join(str(exc).split())[:120]})",
            "pass the model's published files",
        ) from None
    tok.name_or_path = str(folder)
    return tok
