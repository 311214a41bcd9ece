"""K/V ablations of a guide prefix, against true removal of the guide.

The guide (the ghost of the exact-token split, prefilled once) is modified at selected layers on
the guide positions (the leading special tokens such as BOS are kept: they are not guide content),
then the live prompt is prefilled after it and the model continues greedily:

- ``k_zero``: keys of the guide positions zeroed, values kept,
- ``v_zero``: values zeroed, keys kept,
- ``kv_zero``: both zeroed,
- ``remove_prefill``: true removal by masking: the guide positions are masked out of attention at
  the selected layers while the live tokens are prefilled and in every later step (when every
  layer is selected the live tokens are also re-numbered to follow the kept prefix, which is what
  ``generate`` does with a 0/1 attention mask: the result is the sequence without the guide),
- ``remove_decode``: the mask applied only at decode time: the live prompt (all but its last
  token) is prefilled *seeing* the guide, then the guide is masked for the last prompt token and
  the generated ones (what masking at ``generate`` time after an unmasked prefill does),
- ``recompute``: the kept prefix + live prompt computed from scratch without the guide,

each against ``intact``: next-token KL and top-1 change, max abs logit difference, and the
agreement of a short greedy generation (also against ``recompute``, the reference for removal).

Why no zeroing equals removal. Attention is ``softmax(q·kᵀ/√d) v`` over *every* cached position.
A zeroed key gives the score ``q·0 = 0``, so the position still gets the weight ``exp(0)/Z``
(often more than it had) and still takes part in the normalisation ``Z``; with its value
retained (``k_zero``) it still adds that weight times its value to the output. Zeroing the value
too (``kv_zero``) removes the position's value from the numerator, but its ``exp(0)`` stays in
the denominator and dilutes the weights of every other position. Only a mask (``-inf`` score)
takes a position out of the softmax. And masking only at decode time is not removal either: the
live tokens' keys and values at later layers were computed while attending to the guide, so the
guide's influence is already inside the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from kvbridge.divergence import first_divergence, kl
from kvbridge.errors import KVBridgeError
from kvbridge.plugins import adapter_of
from kvbridge.module_hooks import HookSet

CONDITIONS = ("intact", "k_zero", "v_zero", "kv_zero", "remove_prefill", "remove_decode", "recompute")


def parse_layers(spec: str | Sequence[int], num_layers: int) -> tuple:
    """Layer indices from ``"all"``, ``"0,2"``, ``"1-3"``, ``"0,2-3"`` or a sequence of indices (validated;
    an empty sequence selects no layer and is refused)."""
    if not isinstance(spec, (str, int)):
        if not spec:
            raise KVBridgeError("no layers selected", "pass --layers all, a list '0,2' or a range '1-3'")
        spec = ",".join(str(int(i)) for i in spec)
    text = str(spec).strip().lower()
    if text in ("all", "*", ""):
        return tuple(range(num_layers))
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if lo > hi:
                    raise ValueError(part)
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise KVBridgeError(f"cannot read layer spec {spec!r}", "use 'all', a list '0,2' or a range '1-3'") from None
    bad = sorted(i for i in out if not 0 <= i < num_layers)
    if bad:
        raise KVBridgeError(
            f"layer(s) {bad} out of range: the model has {num_layers} layers (0-{num_layers - 1})",
            "pick layers that exist",
        )
    return tuple(sorted(out))


def attention_modules(model) -> dict:
    """``{layer index: attention module}`` (modules whose class ends in ``Attention`` with ``layer_idx``)."""
    found: dict = {}
    for _name, mod in model.named_modules():
        idx = getattr(mod, "layer_idx", None)
        if isinstance(idx, int) and type(mod).__name__.endswith("Attention") and idx not in found:
            found[idx] = mod
    return found


class GuideMask(HookSet):
    """Forward pre-hooks that mask key positions ``[start, stop)`` out of attention at some layers
    (while ``active``)."""

    def __init__(self, model, layers: Sequence[int], start: int, stop: int, *, active: bool = False):
        mods = attention_modules(model)
        missing = [i for i in layers if i not in mods]
        if missing:
            raise KVBridgeError(
                f"cannot find the attention module of layer(s) {missing} in {type(model).__name__}",
                "this family's attention modules need a layer_idx attribute",
            )
        impl = getattr(model.config, "_attn_implementation", "eager") or "eager"
        if impl not in ("eager", "sdpa"):
            raise KVBridgeError(
                f"masking needs eager or sdpa attention, the model uses {impl!r}",
                "load the model with attn_implementation='sdpa' or 'eager'",
            )
        self.impl = impl
        self.start, self.stop = start, stop
        self.active = active
        self.handles = [mods[i].register_forward_pre_hook(self._hook(i), with_kwargs=True) for i in layers]

    def _hook(self, layer: int):
        def hook(module, args, kwargs):
            if not self.active:
                return None
            import torch

            hidden = kwargs.get("hidden_states", args[0] if args else None)
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            q = int(hidden.shape[1])
            past = int(cache.get_seq_length(layer)) if cache is not None else 0
            kv = past + q
            mask = kwargs.get("attention_mask")
            keep = torch.ones(kv, dtype=torch.bool, device=hidden.device)
            keep[self.start : self.stop] = False
            if mask is None:
                causal = (
                    torch.arange(kv, device=hidden.device)[None, :]
                    <= (past + torch.arange(q, device=hidden.device))[:, None]
                )
                allowed = (causal & keep)[None, None]
                if self.impl == "eager":
                    zero = torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device)
                    mask = zero.masked_fill(~allowed, torch.finfo(hidden.dtype).min)
                else:
                    mask = allowed
            elif mask.shape[-1] != kv:
                raise KVBridgeError(
                    f"attention mask covers {mask.shape[-1]} keys, expected {kv}",
                    "ablate needs a DynamicCache (no static or sliding-window padding)",
                )
            elif mask.dtype == torch.bool:
                mask = mask & keep
            else:
                mask = mask.masked_fill(~keep, torch.finfo(mask.dtype).min)
            return args, {**kwargs, "attention_mask": mask}

        return hook


@dataclass
class Outcome:
    logits: Any  # next-token logits after the prompt [vocab] float32
    tokens: list  # greedy continuation


def _run(
    model,
    cache,
    ids: list[int],
    positions: list[int] | None,
    max_new_tokens: int,
    mask: GuideMask | None = None,
    mask_prefill: bool = False,
    mask_decode: bool = False,
) -> Outcome:
    """Feed ``ids[:-1]`` (prefill phase), then ``ids[-1]`` and greedy steps (decode phase)."""
    import torch
    from transformers import DynamicCache

    cache = cache if cache is not None else DynamicCache()
    device = next(model.parameters()).device
    pos = list(positions) if positions is not None else None
    next_pos = (pos[-1] + 1) if pos else None

    def forward(chunk: list[int], chunk_pos: list[int] | None, masked: bool):
        if mask is not None:
            mask.active = masked
        kwargs: dict = {"input_ids": torch.tensor([chunk], device=device), "cache": cache, "use_cache": True}
        if chunk_pos is not None:
            kwargs["position_ids"] = torch.tensor([chunk_pos], device=device)
        return model(**kwargs).logits[0, -1].detach().float().cpu().clone()

    with torch.no_grad():
        if len(ids) > 1:
            forward(ids[:-1], pos[:-1] if pos else None, mask_prefill)
        first = logits = forward(ids[-1:], pos[-1:] if pos else None, mask_prefill or mask_decode)
        tokens: list[int] = []
        for step in range(max_new_tokens):
            tok = int(logits.argmax())
            tokens.append(tok)
            if step + 1 < max_new_tokens:
                p = None if next_pos is None else [next_pos + step]
                logits = forward([tok], p, mask_prefill or mask_decode)
        if mask is not None:
            mask.active = False
    return Outcome(first, tokens)


def _agreement(a: list, b: list) -> dict:
    n = min(len(a), len(b))
    first = first_divergence(a, b)
    prefix = n if first is None else first
    return {
        "identical": first is None,
        "first_difference": first,
        "prefix_match": prefix,
        "agreement": prefix / n if n else 1.0,
        "same_position_match": sum(x == y for x, y in zip(a, b)) / n if n else 1.0,
    }


def _effect(ref: Outcome, got: Outcome) -> dict:
    return {
        "kl": float(kl(ref.logits, got.logits).sum()),
        "top1_ref": int(ref.logits.argmax()),
        "top1": int(got.logits.argmax()),
        "top1_changed": int(ref.logits.argmax()) != int(got.logits.argmax()),
        "max_abs_logit_diff": float((ref.logits - got.logits).abs().max()),
        "greedy": _agreement(ref.tokens, got.tokens),
    }


@dataclass
class AblationReport:
    layers: tuple
    num_layers: int
    guide_positions: tuple  # (start, stop) in the cache
    split: dict
    conditions: dict  # name -> {"vs_intact": {...}, "vs_recompute": {...}, "tokens": [...]}
    positions: dict  # name -> "kept" | "renumbered"
    intact_vs_visible_max_abs: float
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:  # the fields in order, JSON-ready
        renamed = {"intact_vs_visible_max_abs": "intact_vs_visible_max_abs_logit_diff"}
        return {renamed.get(k, k): list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}

    def lines(self) -> list[str]:
        start, stop = self.guide_positions
        out = [
            f"guide positions {start}-{stop - 1} ({stop - start} tokens) at layers "
            f"{','.join(map(str, self.layers))} of {self.num_layers}; "
            f"intact vs visible prompt max|dlogit| {self.intact_vs_visible_max_abs:.2g}",
            f"{'condition':<16}{'KL(intact||c)':>14}{'top1 chg':>9}{'greedy agr':>11}{'KL(recomp||c)':>15}"
            f"{'greedy=recomp':>14}",
        ]
        for name, c in self.conditions.items():
            vi, vr = c["vs_intact"], c["vs_recompute"]
            out.append(
                f"{name:<16}{vi['kl']:>14.4g}{'yes' if vi['top1_changed'] else 'no':>9}"
                f"{vi['greedy']['agreement']:>11.2f}{vr['kl']:>15.4g}"
                f"{'yes' if vr['greedy']['identical'] else 'no':>14}"
            )
        out.extend(f"note: {n}" for n in self.notes)
        return out


def ablate(
    model,
    tokenizer,
    guide: str,
    prompt: str,
    *,
    sep: str = " ",
    layers: str | Sequence[int] = "all",
    max_new_tokens: int = 16,
    host=None,
) -> AblationReport:
    """Run every condition and compare it with ``intact`` and ``recompute`` (see the module docstring)."""
    import torch

    from kvbridge.prefix import packs
    from kvbridge.prefix.splits import exact_split

    if max_new_tokens < 1:
        raise KVBridgeError(f"max-new-tokens must be >= 1, got {max_new_tokens}", "pass --max-new-tokens 1 or more")
    report, split = exact_split(tokenizer, guide, prompt, sep)  # asserts ghost + live == joint
    adapter = adapter_of(model, host)
    spec = adapter.spec_of(model)
    chosen = parse_layers(layers, spec.num_layers)
    ghost, live = list(split.ghost), list(split.live)
    total = len(ghost) + len(live) + max_new_tokens
    packs.check_guide_length(len(ghost), spec, total=total, new=max_new_tokens)
    keep = len(report.special_prefix) if tuple(ghost[: len(report.special_prefix)]) == report.special_prefix else 0
    start, stop = keep, len(ghost)
    if stop <= start:
        raise KVBridgeError("the guide has no tokens besides special tokens", "pass a longer guide")
    from kvbridge.spec import SLIDING

    sliding = [i for i in chosen if spec.layer_type(i) == SLIDING]
    if sliding and spec.sliding_window and total > spec.sliding_window:
        raise KVBridgeError(
            f"layer(s) {sliding} are sliding-window layers (window {spec.sliding_window}) and the "
            f"sequence has {total} tokens: the removal mask would ignore the window",
            "select full-attention layers or shorten the texts below the window",
        )
    device = next(model.parameters()).device
    state = adapter.extract(model, torch.tensor([ghost], device=device), spec=spec)

    def zeroed(k: bool, v: bool):
        keys, values = [t.clone() for t in state.keys], [t.clone() for t in state.values]
        for i in chosen:
            for group, on in ((keys, k), (values, v)):
                if on:
                    group[i][:, :, start:stop] = 0
        return replace(state, keys=tuple(keys), values=tuple(values))

    def inject(s):
        return adapter.inject(s, model)

    all_layers = len(chosen) == spec.num_layers
    outcomes = {"intact": _run(model, inject(state), live, None, max_new_tokens)}
    for name, k, v in (("k_zero", True, False), ("v_zero", False, True), ("kv_zero", True, True)):
        outcomes[name] = _run(model, inject(zeroed(k, v)), live, None, max_new_tokens)
    renumbered = list(range(keep, keep + len(live))) if all_layers else None
    with GuideMask(model, chosen, start, stop) as m:
        outcomes["remove_prefill"] = _run(model, inject(state), live, renumbered, max_new_tokens, m, mask_prefill=True)
    with GuideMask(model, chosen, start, stop) as m:
        outcomes["remove_decode"] = _run(model, inject(state), live, None, max_new_tokens, m, mask_decode=True)
    outcomes["recompute"] = _run(model, None, ghost[:keep] + live, None, max_new_tokens)
    joint = torch.tensor([list(report.joint)], device=device)
    with torch.no_grad():
        visible = model(input_ids=joint, use_cache=False).logits[0, -1].float().cpu()
    intact, recomputed = outcomes["intact"], outcomes["recompute"]
    conditions = {  # in CONDITIONS order
        name: {"vs_intact": _effect(intact, o), "vs_recompute": _effect(recomputed, o), "tokens": o.tokens}
        for name, o in outcomes.items()
    }
    positions = {name: "kept" for name in CONDITIONS}
    positions["remove_prefill"] = "renumbered" if all_layers else "kept"
    positions["recompute"] = "renumbered"
    notes = [
        "zeroed keys still take part in the softmax: score q.0 = 0 gives weight exp(0)/Z, so k_zero keeps the "
        "positions' values in the output and kv_zero still dilutes every other weight through Z; only a mask removes",
        "remove_decode masks the guide only after the live prompt was prefilled attending to it: the live tokens' "
        "K/V already carry the guide, so it is not removal",
        "all layers selected: remove_prefill re-numbers the live positions after the kept prefix, so it "
        "should match recompute up to floating-point noise"
        if all_layers
        else "only some layers selected: remove_prefill keeps positions (the other layers still see the "
        "guide); recompute removes the guide everywhere",
    ]
    split_info = {
        "kind": split.kind,
        "matches_joint": split.matches_joint,
        "ghost_len": len(ghost),
        "live_len": len(live),
        "joint_len": len(report.joint),
        "special_prefix": list(report.special_prefix),
    }
    return AblationReport(
        layers=chosen,
        num_layers=spec.num_layers,
        guide_positions=(start, stop),
        split=split_info,
        conditions=conditions,
        positions=positions,
        intact_vs_visible_max_abs=float((visible - intact.logits).abs().max()),
        notes=notes,
    )
