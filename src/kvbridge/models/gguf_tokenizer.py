"""The tokenizer fingerprint of a GGUF file, from its ``tokenizer.ggml.*`` metadata (torch-free).

The token list, token types and merges are decoded and hashed the way
:mod:`kvbridge.check.tokenizer_fp` hashes ``tokenizer.json`` (id -> token, merges as pairs), so a
GGUF and the Hugging Face folder it was converted from can compare ``same`` when their token
ids line up. Control and user-defined tokens (types 3 and 4) count as added tokens.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from kvbridge.models.gguf import GGUFArray, GGUFInfo, read_gguf

_WANTED = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")


def _cache_key(meta: dict) -> str:
    """What decides the fingerprint: the tokenizer metadata (large arrays by their raw sha256)."""
    parts = sorted(
        (k, v.sha256 if isinstance(v, GGUFArray) else repr(v))
        for k, v in meta.items()
        if k.startswith("tokenizer.ggml.")
    )
    return "gguf:" + hashlib.sha256(repr(parts).encode()).hexdigest()


@lru_cache(maxsize=8)
def gguf_tokenizer_fingerprint(info: GGUFInfo):
    """A :class:`~kvbridge.check.tokenizer_fp.TokenizerFingerprint` of ``info``'s tokenizer, or None.

    Cached (in process and in the tokenizer-fingerprint cache file) by the tokenizer metadata.
    """
    from kvbridge.check import tokenizer_fp as tf

    meta = info.metadata
    if meta.get("tokenizer.ggml.tokens") is None:
        return None
    return tf.cached(lambda: _cache_key(meta), lambda: _compute(info, tf))


def _compute(info: GGUFInfo, tf):
    meta = info.metadata
    tokens_meta = meta.get("tokenizer.ggml.tokens")
    decoded = read_gguf(info.path, decode=_WANTED).metadata  # the tokenizer arrays: a second pass over the header
    arrays = {k: decoded[k] for k in _WANTED if isinstance(decoded.get(k), list)}
    tokens = arrays.get("tokenizer.ggml.tokens") or (tokens_meta if isinstance(tokens_meta, list) else [])
    merges = arrays.get("tokenizer.ggml.merges")
    full = dict(enumerate(tokens))
    added = {i for i, t in enumerate(arrays.get("tokenizer.ggml.token_type") or []) if t in (3, 4)}
    base = {i: t for i, t in full.items() if i not in added}
    roles = {}
    for role, k in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        tid = meta.get(f"tokenizer.ggml.{k}_token_id")
        if isinstance(tid, int) and 0 <= tid < len(tokens):
            roles[role] = tokens[tid]
    for flag in ("add_bos_token", "add_eos_token"):
        if isinstance(meta.get(f"tokenizer.ggml.{flag}"), bool):
            roles[flag] = meta[f"tokenizer.ggml.{flag}"]
    rules = tf._merges_from_list(merges) if merges is not None else None
    model = str(meta.get("tokenizer.ggml.model", ""))
    return tf.TokenizerFingerprint(
        kind={"gpt2": "bpe", "llama": "sentencepiece-bpe"}.get(model, model or "gguf"),
        base=tf._sha(sorted(base.items())),
        vocab=tf._sha(sorted(full.items())),
        rules=tf._sha(rules) if rules is not None else "",
        rules_format="merges" if merges is not None else "",
        special=tf._sha(roles),
        vocab_size=len(full),
        num_added=len(added),
        special_tokens=tuple(sorted((k, str(v)) for k, v in roles.items())),
        files=(Path(info.path).name,),
    )
