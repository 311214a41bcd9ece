"""Residual-stream hooks: read a decoder layer's output, or add a direction to it (activation addition).

The residual stream after decoder layer ``i`` is the layer's output hidden state. Two plain
torch forward hooks work on it:

- :class:`ResidualCapture` keeps the output at chosen positions while a forward runs (used by
  :func:`kvbridge.steer.vectors.build_vector` to build the residual direction from the same pairs
  and the same positions as the K/V directions, in the same forward pass);
- :class:`ActivationAddition` adds ``coefficient * direction[i]`` to the output of the chosen
  layers at every position of every forward while it is active (the prompt and each generated
  token; a context manager: the hooks are removed on exit): the standard residual-stream steering baseline (ActAdd / CAA style), which, unlike a
  cache edit, acts again on every new token.
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

from kvbridge.errors import KVBridgeError
from kvbridge.module_hooks import HookSet


def decoder_layers(model) -> dict:
    """``{layer index: decoder layer module}``: the parent module of each attention module."""
    from kvbridge.prefix.ablate import attention_modules

    attn = attention_modules(model)
    if not attn:
        raise KVBridgeError(
            f"cannot find the attention modules of {type(model).__name__}",
            "residual hooks need attention modules with a layer_idx attribute",
        )
    # every name named_modules gives has its parent among them ("" is the model itself)
    names = {id(mod): name for name, mod in model.named_modules()}
    return {i: model.get_submodule(names[id(mod)].rpartition(".")[0]) for i, mod in attn.items()}


class ResidualCapture(HookSet):
    """Forward hooks keeping ``output[:, start:stop]`` of every decoder layer (float32, detached)."""

    def __init__(self, model):
        self.layers = decoder_layers(model)
        self.window = (0, None)
        self.captured: dict = {}
        self.handles = [mod.register_forward_hook(partial(self._hook, i)) for i, mod in self.layers.items()]

    def _hook(self, layer: int, module, args, output):
        a, b = self.window
        hidden = output[0] if isinstance(output, tuple) else output
        self.captured[layer] = hidden[:, a:b].detach().float().clone()


class ActivationAddition(HookSet):
    """Forward hooks adding ``coefficient * directions[i]`` to decoder layer ``i``'s output."""

    def __init__(self, model, directions: dict, coefficient: float, layers: Sequence[int]):
        import torch

        mods = decoder_layers(model)
        missing = [i for i in layers if i not in mods]
        if missing:
            raise KVBridgeError(f"no decoder layer {missing} in {type(model).__name__}", "pick layers that exist")
        self.coefficient = float(coefficient)
        p = next(model.parameters())
        self.delta = {i: (self.coefficient * directions[i].to(p.device, torch.float32)).to(p.dtype) for i in layers}
        self.handles = [mods[i].register_forward_hook(partial(self._hook, i)) for i in layers]

    def _hook(self, layer: int, module, args, output):
        delta = self.delta[layer]
        if isinstance(output, tuple):
            return (output[0] + delta,) + tuple(output[1:])
        return output + delta
