"""The recipe of the shipped SmolLM2 Shakespeare LoRA: ``python -m tools.train_lora`` (from the repository root).

Everything that decides the weights is fixed here: the base model (``smollm2``, dequantized
float32), the corpus slice, the seed (LoRA init and the data order), rank/alpha/targets, steps,
batch, sequence length, AdamW hyper-parameters, warm-up + cosine schedule and the torch thread
count. On one torch build and thread count the same recipe gives bit-identical adapter weights.

Data (``tinyshakespeare.txt``, cut at line starts; fractions of the characters):

- training: ``[0.50, 0.70)``; held-out loss: ``[0.80, 0.90)``;
- both are disjoint from what the rest of kvbridge reads: ``kvbridge eval`` samples the last
  10% (``[0.90, 1.0)``), the adapter pair's fits calibrate on the front (``[0, 0.25)``).

Writes ``adapter_config.json`` + ``adapter_model.safetensors`` (peft's own format, no pickle),
``recipe.json`` (the recipe, the loss curve, base vs adapter held-out loss) into ``--out``
(written to a temporary folder first, then moved into place).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvbridge.adapters import DEFAULT_CORPUS
from kvbridge.corpus import slice_text


@dataclass(frozen=True)
class LoraRecipe:
    base: str = "smollm2"
    corpus_sha256: str = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    train_slice: tuple[float, float] = (0.50, 0.70)
    heldout_slice: tuple[float, float] = (0.80, 0.90)
    seed: int = 0
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("k_proj", "o_proj", "q_proj", "v_proj")
    steps: int = 100
    batch_size: int = 4
    seq_len: int = 64
    lr: float = 2e-3
    warmup: int = 10
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    threads: int = 1
    heldout_windows: int = 32
    heldout_len: int = 128
    notes: str = field(default="LoRA (peft) on the dequantized float32 base; loss = next-token NLL over every position")


RECIPE = LoraRecipe()


def encode(tokenizer, text: str):
    import torch

    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


def heldout_nll(model, windows, batch: int = 8) -> "torch.Tensor":  # noqa: F821
    """Mean next-token NLL (nats) of each window: ``[n]``."""
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, windows.shape[0], batch):
            x = windows[i : i + batch]
            logits = model(input_ids=x[:, :-1]).logits.float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
            out.append(nll.mean(dim=1))
    return torch.cat(out)


def _lr(step: int, r: LoraRecipe) -> float:
    if step < r.warmup:
        return r.lr * (step + 1) / r.warmup
    p = (step - r.warmup) / max(1, r.steps - r.warmup)
    return r.lr * 0.5 * (1 + math.cos(math.pi * p))


def train(recipe: LoraRecipe, corpus: Path, out: Path, log=print) -> dict:
    import hashlib

    import torch
    from peft import LoraConfig, get_peft_model

    from kvbridge.models import load
    from kvbridge.evaluate import windows as even_windows

    raw = corpus.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    if recipe.corpus_sha256 and sha != recipe.corpus_sha256:
        raise SystemExit(
            f"error: {corpus} has sha256 {sha}, the recipe expects {recipe.corpus_sha256} "
            "(fix: pass the tinyshakespeare.txt the recipe was written for)"
        )
    text = raw.decode("utf-8")
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    torch.use_deterministic_algorithms(True)

    loaded = load(recipe.base, dtype=torch.float32)
    model, tok = loaded.model, loaded.tokenizer
    train_ids = encode(tok, slice_text(text, *recipe.train_slice))
    held_ids = encode(tok, slice_text(text, *recipe.heldout_slice))
    held = even_windows(held_ids, recipe.heldout_windows, recipe.heldout_len + 1)
    model.eval()
    t0 = time.perf_counter()
    base_nll = heldout_nll(model, held)
    log(f"base held-out NLL {base_nll.mean():.4f} ({time.perf_counter() - t0:.1f}s)")

    cfg = LoraConfig(
        r=recipe.rank,
        lora_alpha=recipe.alpha,
        target_modules=list(recipe.targets),
        lora_dropout=0.0,
        bias="none",
        init_lora_weights=True,
    )
    torch.manual_seed(recipe.seed)
    pm = get_peft_model(model, cfg)
    params = [p for p in pm.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, betas=recipe.betas, weight_decay=recipe.weight_decay)
    gen = torch.Generator().manual_seed(10_000 + recipe.seed)
    n = train_ids.numel() - recipe.seq_len - 1
    offsets = torch.arange(recipe.seq_len + 1)
    curve = []
    pm.train()
    t0 = time.perf_counter()
    for step in range(recipe.steps):
        starts = torch.randint(0, n + 1, (recipe.batch_size,), generator=gen)
        x = train_ids[starts[:, None] + offsets]
        for g in opt.param_groups:
            g["lr"] = _lr(step, recipe)
        logits = pm(input_ids=x[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == recipe.steps - 1:
            value = loss.item()
            curve.append([step, round(value, 5)])
            log(f"step {step:4d} loss {value:.4f} ({time.perf_counter() - t0:.0f}s)")
    train_s = time.perf_counter() - t0
    pm.eval()
    tuned_nll = heldout_nll(pm, held)
    diff = tuned_nll - base_nll
    result = {
        "heldout_windows": int(held.shape[0]),
        "heldout_tokens_per_window": recipe.heldout_len,
        "base_nll": float(base_nll.mean()),
        "adapter_nll": float(tuned_nll.mean()),
        "nll_diff_mean": float(diff.mean()),
        "nll_diff_se": float(diff.std() / math.sqrt(diff.numel())),
        "windows_improved": int((diff < 0).sum()),
        "train_seconds": round(train_s, 1),
        "train_tokens": recipe.steps * recipe.batch_size * recipe.seq_len,
        "train_slice_tokens": int(train_ids.numel()),
        "heldout_slice_tokens": int(held_ids.numel()),
        "corpus_sha256": sha,
        "torch": torch.__version__,
    }
    log(
        f"held-out NLL base {result['base_nll']:.4f} adapter {result['adapter_nll']:.4f} "
        f"(diff {result['nll_diff_mean']:+.4f} +- {result['nll_diff_se']:.4f} se)"
    )

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".lora-", dir=out.parent))
    try:
        pm.save_pretrained(str(tmp), safe_serialization=True)
        for extra in tmp.iterdir():  # keep only the two adapter files (peft also writes a model card)
            if extra.name not in ("adapter_config.json", "adapter_model.safetensors"):
                extra.unlink() if extra.is_file() else shutil.rmtree(extra)
        cfg_path = tmp / "adapter_config.json"
        c = json.loads(cfg_path.read_text())
        c["base_model_name_or_path"] = recipe.base
        cfg_path.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
        rec = {
            "recipe": asdict(recipe),
            "result": result,
            "loss_curve": curve,
            "command": "python -m tools.train_lora --out src/kvbridge/adapters/smollm2-shakespeare",
        }
        (tmp / "recipe.json").write_text(json.dumps(rec, indent=2) + "\n")
        keep = out / "README.md"
        if keep.is_file():
            shutil.copy2(keep, tmp / "README.md")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return result


def main(argv=None) -> int:
    from kvbridge.adapters import SHIPPED

    p = argparse.ArgumentParser(prog="python -m tools.train_lora", description=__doc__.split("\n")[0])
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--out", type=Path, default=SHIPPED)
    p.add_argument("--steps", type=int, default=RECIPE.steps, help="(changing it changes the recipe)")
    a = p.parse_args(argv)
    recipe = LoraRecipe(steps=a.steps) if a.steps != RECIPE.steps else RECIPE
    train(recipe, a.corpus, a.out, log=lambda s: print(s, flush=True, file=sys.stderr))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
