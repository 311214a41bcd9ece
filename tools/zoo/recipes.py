"""Deterministic recipes for the tiny model zoo (pure data: imports neither torch nor transformers).

A recipe fixes everything a build depends on besides the corpus bytes and the torch build:
the tokenizer's training slice and vocabulary size, each model's architecture, seed, data slice,
steps, batch, sequence length and optimiser schedule. :func:`recipe_hash` is the sha256 of the
canonical JSON of a recipe; the manifest records it next to the corpus sha256, so a shipped model
can be traced to exactly what produced it.

The corpus is split by contiguous character slices (fractions of its length, cut at line starts):

* ``base``: the first 75% (every model except ``tuned`` trains here; the tokenizer too);
* ``tune``: 75%..90%, disjoint from ``base`` (``tuned`` continues ``base`` on it);
* ``heldout``: the last 10%, never trained on (held-out loss and unigram entropy).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace

from kvbridge.zoo import CORPUS_NAME, SPLITS

__all__ = ["CORPUS_NAME", "SPLITS"]  # declared once, in the package (the loader and the demo read them)

CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"

SPECIAL_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class TokenizerRecipe:
    """A byte-level BPE trained with the ``tokenizers`` library on one slice of the corpus."""

    vocab_size: int = 1024
    min_frequency: int = 2
    split: str = "base"
    special_tokens: tuple[str, ...] = (SPECIAL_TOKEN,)
    model_max_length: int = 512


@dataclass(frozen=True)
class ArchRecipe:
    """A ``LlamaConfig`` in the few numbers that matter here (vocab comes from the tokenizer)."""

    num_hidden_layers: int = 4
    hidden_size: int = 128
    intermediate_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 10000.0
    max_position_embeddings: int = 512
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02

    def config_kwargs(self) -> dict:
        """Keyword arguments for ``transformers.LlamaConfig`` (minus token ids and vocab)."""
        kw = asdict(self)
        theta = kw.pop("rope_theta")
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
        return kw


@dataclass(frozen=True)
class TrainRecipe:
    """One deterministic training run: AdamW, linear warm-up then cosine decay to ``min_lr_ratio``."""

    split: str = "base"
    seed: int = 0
    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0


@dataclass(frozen=True)
class ModelRecipe:
    """A zoo model: an architecture and a run, optionally continuing another zoo model (``init_from``)."""

    name: str
    description: str
    arch: ArchRecipe
    train: TrainRecipe
    init_from: str | None = None
    weights_dtype: str = "float16"


@dataclass(frozen=True)
class ZooRecipe:
    tokenizer: TokenizerRecipe
    models: tuple[ModelRecipe, ...]
    splits: tuple[tuple[str, float, float], ...] = field(
        default_factory=lambda: tuple((k, a, b) for k, (a, b) in SPLITS.items())
    )
    eval_seq_len: int = 128
    eval_max_tokens: int = 65536  # the held-out split is scored on at most this many tokens
    num_threads: int = 1  # torch intra-op threads for the build (numerics depend on it)
    sample_prompt: str = "ROMEO:\n"
    sample_tokens: int = 96
    sample_seed: int = 0

    def model(self, name: str) -> ModelRecipe:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(f"no zoo model {name!r}; known: {', '.join(m.name for m in self.models)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)


def canonical_json(obj) -> str:
    if hasattr(obj, "__dataclass_fields__"):
        obj = asdict(obj)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def recipe_hash(obj) -> str:
    """sha256 of the canonical JSON of a recipe (any of the dataclasses above)."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


# -- the shipped zoo -------------------------------------------------------------------------------
# Sized for about 20 minutes of training on one contended CPU core (measured 1,000-3,300 tokens/s).
BASE_ARCH = ArchRecipe()
BASE_TRAIN = TrainRecipe(split="base", seed=0, steps=320, batch_size=16, seq_len=128, lr=4e-3, warmup_steps=30)

ZOO = ZooRecipe(
    tokenizer=TokenizerRecipe(),
    models=(
        ModelRecipe("base", "4 layers, hidden 128, 4 heads / 2 KV heads of 32, RoPE theta 1e4", BASE_ARCH, BASE_TRAIN),
        ModelRecipe(
            "wide",
            "same tokenizer, KV heads and head dim as base; 6 layers, hidden 192, 6 heads, RoPE theta 5e4",
            replace(
                BASE_ARCH,
                num_hidden_layers=6,
                hidden_size=192,
                intermediate_size=384,
                num_attention_heads=6,
                rope_theta=50000.0,
            ),
            replace(BASE_TRAIN, seed=1, steps=200, lr=3e-3, warmup_steps=20),
        ),
        ModelRecipe(
            "odd",
            "base's depth and width with another KV geometry: 8 heads / 4 KV heads of 16",
            replace(BASE_ARCH, num_attention_heads=8, num_key_value_heads=4, head_dim=16),
            replace(BASE_TRAIN, seed=2),
        ),
        ModelRecipe(
            "tuned",
            "base (as shipped, fp16) trained further on the disjoint 'tune' slice",
            BASE_ARCH,
            replace(BASE_TRAIN, split="tune", seed=3, steps=64, lr=1e-3, warmup_steps=8),
            init_from="base",
        ),
        ModelRecipe(
            "stranger",
            "base's architecture and recipe from another seed (negative control)",
            BASE_ARCH,
            replace(BASE_TRAIN, seed=4),
        ),
    ),
)

#: a very small recipe for the determinism test (a few steps, seconds on one core)
TINY = ZooRecipe(
    tokenizer=TokenizerRecipe(vocab_size=300),
    models=(
        ModelRecipe(
            "tiny",
            "determinism check",
            replace(
                BASE_ARCH,
                num_hidden_layers=1,
                hidden_size=32,
                intermediate_size=64,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                max_position_embeddings=64,
            ),
            TrainRecipe(steps=4, batch_size=2, seq_len=16, warmup_steps=1),
        ),
        ModelRecipe(
            "tiny_tuned",
            "determinism check (continued)",
            replace(
                BASE_ARCH,
                num_hidden_layers=1,
                hidden_size=32,
                intermediate_size=64,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                max_position_embeddings=64,
            ),
            TrainRecipe(split="tune", steps=2, batch_size=2, seq_len=16, warmup_steps=1),
            init_from="tiny",
        ),
    ),
    eval_seq_len=16,
    eval_max_tokens=256,
    sample_tokens=8,
)
