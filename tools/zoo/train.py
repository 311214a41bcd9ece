"""A small deterministic training loop for the zoo's Llama models.

Everything that decides the result is fixed by the recipe: the seed (model init and the data
order both come from it), the contiguous corpus slice, steps, batch, sequence length, AdamW
hyper-parameters and the warm-up + cosine schedule. On one torch build and thread count, the same
recipe and corpus give bit-identical weights (``tests/tools/test_zoo_build.py`` checks this on a tiny recipe).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from kvbridge.corpus import line_cut
from kvbridge.zoo import SPLITS
from tools.zoo.recipes import ArchRecipe, TrainRecipe


# -- data -----------------------------------------------------------------------------------------
def split_bounds(text: str, split: str) -> tuple[int, int]:
    """Character bounds of a named split; cuts move forward to the next line start."""
    lo, hi = SPLITS[split]
    return line_cut(text, lo), line_cut(text, hi)


def encode(tokenizer, text: str) -> torch.Tensor:
    """Token ids of ``text`` as a 1-D int64 tensor (the raw ``tokenizers`` backend, no specials)."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    ids = backend.encode(text, add_special_tokens=False).ids
    return torch.tensor(ids, dtype=torch.long)


def batches(tokens: torch.Tensor, recipe: TrainRecipe):
    """The fixed data order: ``steps`` batches of random windows drawn from a generator seeded by the recipe."""
    n = tokens.numel() - recipe.seq_len - 1
    if n <= 0:
        raise ValueError(f"split has {tokens.numel()} tokens, fewer than seq_len+1={recipe.seq_len + 1}")
    gen = torch.Generator().manual_seed(10_000 + recipe.seed)
    offsets = torch.arange(recipe.seq_len + 1)
    for _ in range(recipe.steps):
        starts = torch.randint(0, n + 1, (recipe.batch_size,), generator=gen)
        yield tokens[starts[:, None] + offsets]


# -- model ----------------------------------------------------------------------------------------
def make_config(arch: ArchRecipe, vocab_size: int, special_id: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        bos_token_id=special_id,
        eos_token_id=special_id,
        pad_token_id=special_id,
        **arch.config_kwargs(),
    )


def init_model(config, seed: int):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return model.float()


def lr_lambda(recipe: TrainRecipe):
    def f(step: int) -> float:
        if step < recipe.warmup_steps:
            return (step + 1) / recipe.warmup_steps
        span = max(1, recipe.steps - recipe.warmup_steps)
        progress = min(1.0, (step - recipe.warmup_steps) / span)
        return recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def next_token_loss(model, chunk: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of ``chunk`` (batch x (T+1)) predicting positions 1..T."""
    logits = model(input_ids=chunk[:, :-1], use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), chunk[:, 1:].reshape(-1))


@dataclass
class TrainResult:
    steps: int
    tokens: int  # tokens predicted (batch * seq_len * steps)
    seconds: float
    final_loss: float  # mean training loss over the last 5% of steps
    losses: list  # training loss every ``log_every`` steps


def train(model, tokens: torch.Tensor, recipe: TrainRecipe, log=None, log_every: int = 100) -> TrainResult:
    """Train ``model`` in place on ``tokens`` following ``recipe``."""
    torch.manual_seed(recipe.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.lr,
        betas=recipe.betas,
        eps=1e-8,
        foreach=False,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(recipe))
    model.train()
    t0 = time.perf_counter()
    tail = max(1, recipe.steps // 20)
    tail_losses, logged = [], []
    for step, chunk in enumerate(batches(tokens, recipe)):
        loss = next_token_loss(model, chunk)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if recipe.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip, foreach=False)
        opt.step()
        sched.step()
        value = loss.item()
        if step >= recipe.steps - tail:
            tail_losses.append(value)
        if step % log_every == 0 or step == recipe.steps - 1:
            logged.append([step, round(value, 4)])
            if log:
                el = time.perf_counter() - t0
                log(f"  step {step:5d}/{recipe.steps}  loss {value:.3f}  lr {sched.get_last_lr()[0]:.2e}  {el:6.0f}s")
    model.eval()
    seconds = time.perf_counter() - t0
    return TrainResult(
        recipe.steps,
        recipe.steps * recipe.batch_size * recipe.seq_len,
        seconds,
        sum(tail_losses) / len(tail_losses),
        logged,
    )


# -- evaluation -----------------------------------------------------------------------------------
@torch.no_grad()
def heldout_loss(model, tokens: torch.Tensor, seq_len: int, max_tokens: int, batch_size: int = 16) -> tuple[float, int]:
    """Mean next-token loss (nats/token) over non-overlapping windows of ``seq_len + 1`` tokens.

    Returns ``(loss, n_predicted)``; the windows are the first ``max_tokens`` tokens, in order.
    """
    tokens = tokens[: max_tokens + 1]
    n_win = (tokens.numel() - 1) // seq_len
    windows = torch.stack([tokens[i * seq_len : i * seq_len + seq_len + 1] for i in range(n_win)])
    model.eval()
    total, count = 0.0, 0
    for i in range(0, n_win, batch_size):
        chunk = windows[i : i + batch_size]
        logits = model(input_ids=chunk[:, :-1], use_cache=False).logits.float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"
        )
        total += nll.item()
        count += chunk[:, 1:].numel()
    return total / count, count


def scored_targets(tokens: torch.Tensor, seq_len: int, max_tokens: int) -> torch.Tensor:
    """The token ids :func:`heldout_loss` predicts (for the unigram entropy of the same split)."""
    tokens = tokens[: max_tokens + 1]
    n_win = (tokens.numel() - 1) // seq_len
    return torch.cat([tokens[i * seq_len + 1 : i * seq_len + seq_len + 1] for i in range(n_win)])


def unigram_entropy(ids: torch.Tensor, vocab_size: int) -> float:
    """Entropy (nats/token) of the empirical unigram distribution of ``ids``.

    This is the loss of the best possible context-free model *fitted to the scored tokens
    themselves*, a lower bound for any unigram model, so a stricter baseline than one fitted on
    the training split.
    """
    counts = torch.bincount(ids, minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


@torch.no_grad()
def sample(
    model, tokenizer, prompt: str, max_new_tokens: int = 80, seed: int = 0, temperature: float = 0.8, top_k: int = 40
) -> str:
    """Seeded top-k sampling with the KV cache; returns prompt + continuation."""
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    ids = encode(tokenizer, prompt)[None]
    cache = DynamicCache()
    out = model(input_ids=ids, cache=cache, use_cache=True)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None) or cache
    logits = out.logits[:, -1]
    new = []
    for _ in range(max_new_tokens):
        logits = logits.float() / temperature
        kth = torch.topk(logits, top_k).values[:, -1:]
        probs = torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)
        nxt = torch.multinomial(probs, 1, generator=gen)
        new.append(int(nxt))
        out = model(input_ids=nxt, cache=cache, use_cache=True)
        cache = getattr(out, "cache", None) or cache
        logits = out.logits[:, -1]
    return prompt + tokenizer.decode(new)
