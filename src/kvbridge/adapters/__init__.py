"""Real adapter pairs: a base model and the same model with a LoRA adapter merged in.

The shipped pair is SmolLM2-135M-Instruct (the ``smollm2`` reference) and a rank-8 LoRA on
its q/k/v/o projections trained on Shakespeare (``smollm2-shakespeare/``, recipe in
``tools/train_lora.py`` in a checkout)::

    from kvbridge.adapters import load_adapter_pair
    pair = load_adapter_pair()          # AdapterPair(base, tuned, tokenizer, adapter)
    pair.base, pair.tuned               # two float32 LlamaForCausalLM, same geometry and tokenizer

Loading never executes code shipped with the adapter and never needs ``peft``: the adapter is
an ``adapter_config.json`` (read as data; only ``r``, ``lora_alpha``, ``target_modules`` and
``fan_in_fan_out`` are used) plus an ``adapter_model.safetensors``, and merging is
``W += (lora_alpha / r) * B @ A`` on each targeted linear weight, done here in float32.
Importing this package imports nothing heavy.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbridge.errors import KVBridgeError

#: the adapter shipped with kvbridge (package data)
SHIPPED = Path(__file__).resolve().parent / "smollm2-shakespeare"
#: the corpus the adapter pair reads by default (``$KVBRIDGE_CORPUS``): the LoRA's training text
DEFAULT_CORPUS = Path(os.environ.get("KVBRIDGE_CORPUS", "/work/shared/corpora/tinyshakespeare.txt"))


class AdapterError(KVBridgeError):
    """An adapter folder cannot be used (missing files, pickle weights, shape mismatch)."""


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter folder holds (read without torch)."""

    path: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    fan_in_fan_out: bool
    sha256: str  #: of adapter_model.safetensors
    recipe: dict | None  #: recipe.json next to the adapter, when present

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


@dataclass(frozen=True)
class AdapterPair:
    """A base model, the same model with an adapter merged in, their shared tokenizer."""

    base: Any
    tuned: Any
    tokenizer: Any
    adapter: AdapterInfo
    base_name: str = "smollm2"


def read_adapter(adapter_dir: str | Path = SHIPPED) -> AdapterInfo:
    """Describe a PEFT-style LoRA folder; refuses pickle weights and unsupported LoRA variants."""
    from kvbridge.artifacts import sha256_file
    from kvbridge.check.validate import load_json

    d = Path(adapter_dir)
    cfg_path, w_path = d / "adapter_config.json", d / "adapter_model.safetensors"
    if not cfg_path.is_file():
        raise AdapterError(f"{d}: no adapter_config.json", "pass a folder written by peft's save_pretrained")
    if not w_path.is_file():
        if (d / "adapter_model.bin").exists():
            raise AdapterError(
                f"{d}: adapter weights are a pickle (adapter_model.bin); kvbridge never unpickles",
                "re-save the adapter with safe_serialization=True",
            )
        raise AdapterError(f"{d}: no adapter_model.safetensors", "pass a folder written by peft's save_pretrained")
    cfg = load_json(cfg_path, what="adapter config", error=AdapterError)
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"{cfg_path}: peft_type {cfg.get('peft_type')!r} is not LORA", "pass a LoRA adapter")
    for flag in ("use_dora", "use_rslora"):
        if cfg.get(flag):
            raise AdapterError(f"{cfg_path}: {flag} adapters are not supported", "train a plain LoRA adapter")
    targets = cfg.get("target_modules") or []
    if isinstance(targets, str):
        raise AdapterError(f"{cfg_path}: target_modules is a regex ({targets!r})", "list the module names")
    recipe_path = d / "recipe.json"
    recipe = load_json(recipe_path, what="adapter recipe", error=AdapterError) if recipe_path.is_file() else None
    return AdapterInfo(
        path=str(d),
        rank=int(cfg["r"]),
        alpha=float(cfg.get("lora_alpha", cfg["r"])),
        target_modules=tuple(sorted(targets)),
        fan_in_fan_out=bool(cfg.get("fan_in_fan_out", False)),
        sha256=sha256_file(w_path),
        recipe=recipe,
    )


def _lora_pairs(state: dict) -> dict[str, tuple[Any, Any]]:
    """``{module path in the base model: (A, B)}`` from PEFT's key names."""
    pairs: dict[str, dict[str, Any]] = {}
    for key, t in state.items():
        part = next((part for part in ("lora_A", "lora_B") if f".{part}." in key), None)
        if part is None:
            raise AdapterError(
                f"adapter tensor {key!r} is not a LoRA A/B matrix",
                "pass a plain LoRA adapter (no modules_to_save, no bias)",
            )
        pairs.setdefault(key.split(f".{part}.")[0].removeprefix("base_model.model."), {})[part] = t
    bad = [m for m, p in pairs.items() if set(p) != {"lora_A", "lora_B"}]
    if bad:
        raise AdapterError(f"adapter has an A or B matrix missing for {bad[0]}", "re-save the adapter")
    return {m: (p["lora_A"], p["lora_B"]) for m, p in pairs.items()}


def load_with_adapter(base_model, adapter_dir: str | Path = SHIPPED, *, copy_model: bool = True, info=None):
    """``base_model`` with the LoRA in ``adapter_dir`` merged into its weights (a copy by default).

    The merge is done in float32 and cast back to the model's dtype. Returns the merged model;
    ``base_model`` is untouched unless ``copy_model=False``. ``info``: the folder's :func:`read_adapter`
    when the caller has read it.
    """
    import torch
    from safetensors.torch import load_file

    info = info or read_adapter(adapter_dir)
    pairs = _lora_pairs(load_file(str(Path(adapter_dir) / "adapter_model.safetensors")))
    model = copy.deepcopy(base_model) if copy_model else base_model
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, (a, b) in sorted(pairs.items()):
            mod = modules.get(name)
            if mod is None or not hasattr(mod, "weight"):
                raise AdapterError(
                    f"adapter targets {name}, which the model does not have",
                    "load the adapter onto the base model it was trained for",
                )
            w = mod.weight
            delta = (b.float() @ a.float()) * info.scaling
            if info.fan_in_fan_out:
                delta = delta.T
            if tuple(delta.shape) != tuple(w.shape):
                raise AdapterError(
                    f"adapter for {name} has shape {tuple(delta.shape)}, the model's weight is {tuple(w.shape)}",
                    "load the adapter onto the base model it was trained for",
                )
            w.copy_((w.float() + delta).to(w.dtype))
    return model


def load_adapter_pair(adapter_dir: str | Path = SHIPPED, base: str = "smollm2", dtype=None) -> AdapterPair:
    """The base model and base+adapter (merged), sharing one tokenizer."""
    from kvbridge.models import load

    loaded = load(base, dtype=dtype)
    model = loaded.model.eval()
    info = read_adapter(adapter_dir)  # read (and its weights hashed) once
    tuned = load_with_adapter(model, adapter_dir, info=info).eval()
    return AdapterPair(base=model, tuned=tuned, tokenizer=loaded.tokenizer, adapter=info, base_name=base)


__all__ = [
    "SHIPPED",
    "DEFAULT_CORPUS",
    "AdapterError",
    "AdapterInfo",
    "AdapterPair",
    "read_adapter",
    "load_with_adapter",
    "load_adapter_pair",
]
