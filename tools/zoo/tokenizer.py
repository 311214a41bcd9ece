"""Train the zoo's byte-level BPE tokenizer and save it in the Hugging Face format.

The tokenizer is trained with the ``tokenizers`` library on one slice of the corpus and saved with
``PreTrainedTokenizerFast.save_pretrained`` (``tokenizer.json`` + ``tokenizer_config.json``), so
``transformers.AutoTokenizer.from_pretrained(folder)`` loads it offline. Byte-level means every
string round-trips: unseen characters fall back to their bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from tools.zoo.recipes import TokenizerRecipe


def train_tokenizer(text: str, recipe: TokenizerRecipe):
    """A ``tokenizers.Tokenizer`` (byte-level BPE) trained on ``text``; deterministic for a given text."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        min_frequency=recipe.min_frequency,
        special_tokens=list(recipe.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # fixed-size chunks in corpus order: the iterator is part of the recipe's determinism
    chunks = [text[i : i + 4096] for i in range(0, len(text), 4096)]
    tok.train_from_iterator(chunks, trainer=trainer, length=len(chunks))
    return tok


def to_hf(tok, recipe: TokenizerRecipe):
    """Wrap a trained ``tokenizers.Tokenizer`` as a transformers fast tokenizer."""
    from transformers import PreTrainedTokenizerFast

    special = recipe.special_tokens[0]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=special,
        eos_token=special,
        unk_token=None,
        pad_token=special,
        model_max_length=recipe.model_max_length,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(hf_tok, folder: Path) -> list[Path]:
    """Save in the HF format; returns the files written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = hf_tok.save_pretrained(str(folder))
    return [Path(p) for p in written if Path(p).is_file()]


def build_tokenizer(text: str, recipe: TokenizerRecipe):
    """Train and wrap in one step: the transformers tokenizer the zoo models share."""
    return to_hf(train_tokenizer(text, recipe), recipe)
