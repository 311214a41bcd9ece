"""Shared fixtures. Tests that need ../shared read it through `shared_dir` and skip without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Tiny models run fastest single-threaded (and a shared 2-core box stays responsive)."""
    import torch

    torch.set_num_threads(1)


def _shared() -> Path:
    env = os.environ.get("KVBRIDGE_SHARED")
    return Path(env) if env else REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder (real configs, tokenizers, corpus); skip when absent."""
    path = _shared()
    if not (path / "fixtures").is_dir():
        pytest.skip(f"shared fixtures not found at {path}")
    return path


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="module")
def host():
    """An isolated plugin host: the built-in plugins only, no entry points."""
    from kvbridge.plugins import make_host

    return make_host(entry_points=False)


@pytest.fixture
def configs(shared_dir) -> Path:
    """The real model configs in ../shared/fixtures/configs."""
    return shared_dir / "fixtures" / "configs"


@pytest.fixture
def isolated_env(tmp_path, monkeypatch):
    """No real HF cache, no manifest path, a private kvbridge cache (use via `usefixtures`)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hf-cache"))
    monkeypatch.delenv("KVBRIDGE_MANIFEST_PATH", raising=False)
    monkeypatch.setenv("KVBRIDGE_CACHE_DIR", str(tmp_path / "kvcache"))


class TinyLlama:
    """A tiny Llama and a byte-level BPE trained (in well under a second) on a fixed corpus.

    Shared by the split / pack / diverge / ablate tests: `tok` is trained once per session;
    `model()` and `model_dir()` build a fresh, seeded model each call.
    """

    corpus = (
        "The quick brown fox jumps over the lazy dog. You are a careful assistant. Answer in a numbered "
        "list, one item per line. Define zorp: a zorp is a small blue fruit that tastes like lemon. "
        "What colour is a zorp? List three fruits.\n"
    ) * 30
    guide = "Define zorp: a zorp is a small blue fruit that tastes like lemon."
    prompt = "What colour is a zorp?"
    config = dict(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=96,
        initializer_range=0.05,
    )

    def __init__(self):
        self._tok = None

    def tokenizer(self, vocab_size: int = 300):
        """A freshly trained byte-level BPE with a BOS post-processor."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
        from transformers import PreTrainedTokenizerFast

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<s>", "</s>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(self.corpus.split("\n"), trainer)
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")

    @property
    def tok(self):
        """The default tokenizer (vocab 300), trained once and shared."""
        if self._tok is None:
            self._tok = self.tokenizer()
        return self._tok

    def model(self, tok=None, *, seed: int = 0, attn: str | None = None, **config):
        """A seeded tiny Llama sized to `tok` (default `self.tok`); `config` overrides `TinyLlama.config`."""
        import torch
        from transformers import AutoModelForCausalLM, LlamaConfig

        tok = self.tok if tok is None else tok
        cfg = LlamaConfig(**{**self.config, "vocab_size": len(tok), **config})
        if attn is not None:
            cfg._attn_implementation = attn
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(cfg).eval()

    def save(self, folder: Path, model, tok=None) -> Path:
        """Save `model` and its tokenizer into `folder` as a model folder."""
        model.save_pretrained(folder)
        (self.tok if tok is None else tok).save_pretrained(folder)
        return folder

    def model_dir(self, folder: Path, *, tok=None, **model_kw) -> Path:
        """A fresh `model(tok, **model_kw)` saved with its tokenizer into `folder`."""
        return self.save(folder, self.model(tok, **model_kw), tok)


@pytest.fixture(scope="session")
def tiny_llama() -> TinyLlama:
    """The tiny Llama + trained tokenizer factory (see `TinyLlama`)."""
    return TinyLlama()


@pytest.fixture(scope="session")
def tiny_guide() -> str:
    """The guide text the tiny tokenizer was trained on."""
    return TinyLlama.guide


@pytest.fixture(scope="session")
def tiny_prompt() -> str:
    """A prompt that follows `tiny_guide`."""
    return TinyLlama.prompt
