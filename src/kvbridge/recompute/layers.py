"""Layer-selective recompute: the target's own K/V for chosen layers, the mapped K/V elsewhere.

Recomputing layer ``l`` of a prefix needs that layer's *input* hidden states for every prefix
token, which a cache does not hold. Two honest ways, both here:

- ``mode="target"``: the target's own forward over the prefix, stopped right after the last
  recomputed layer (a hook raises after layer ``max(S)``): it costs layers ``0..max(S)`` on
  every prefix token, so a late layer is expensive, and the K/V of the recomputed layers are
  bitwise the target's own prefill's;
- ``mode="source"``: the source's hidden states at the entry of each contiguous group of
  recomputed layers (DroidSpeak reuses them between fine-tunes of one model; they need the
  same width and mean something only when the pair is that close). The group's target layers
  then run on them: cost = the recomputed layers only, plus keeping the source's hidden states
  (``P x hidden`` per group entry). A group that starts at layer 0 uses the target's embeddings.

Selection: by name (``"3,7-9"``), ``"all"``/``"none"``, or by budget (``"auto:15%"``, ``"auto:4"``):
a profiling pass on calibration samples (:func:`profile_layers`) ranks layers by the quality lost
(KL to the native next-token distribution) when *only that layer* comes from the mapping, and
:func:`greedy_groups` (DroidSpeak-style) adds, one at a time, the contiguous group of layers whose
recompute lowers that loss most, given those already chosen. Neither knows what a layer costs:
in target mode any set costs its last layer's depth, so ``method="prefix"`` (layers ``0..K-1``,
no calibration) is the cheapest set of K layers there.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, replace
from functools import partial

import torch

from kvbridge.plugins import adapter_of
from kvbridge.recompute.cost import Cost, causal_pairs, layer_flops, prefill_flops
from kvbridge.recompute.runner import RowStore, embed, parts_of, run_layers, with_kv
from kvbridge.recompute.settings import RecomputeError


# -- selection by name -----------------------------------------------------------------------------
def parse_layers(spec, num_layers: int):
    """``"3,7-9"`` -> ``(3, 7, 8, 9)``; ``"all"``; ``"none"``/``""`` -> ``()``; ``"auto:15%"`` -> ``("auto", 0.15)``.

    ``auto:K`` (an integer) asks for K layers: ``("auto", K / num_layers)``.
    """
    if isinstance(spec, (list, tuple)):
        layers = tuple(sorted({int(x) for x in spec}))
    else:
        text = str(spec).strip().lower()
        if text in ("", "none", "0%"):
            return ()
        if text == "all":
            return tuple(range(num_layers))
        if text.startswith("auto"):
            m = re.fullmatch(r"auto:(\d+(?:\.\d+)?)(%?)", text)
            if not m:
                raise RecomputeError(f"bad layer budget {spec!r}", "use auto:15% (share of layers) or auto:4 (count)")
            share = float(m.group(1)) / 100 if m.group(2) else float(m.group(1)) / num_layers
            if not 0 <= share <= 1:
                raise RecomputeError(
                    f"layer budget {spec!r} is outside 0..100% of {num_layers} layers",
                    "use a share between 0% and 100%",
                )
            return ("auto", share)
        layers = set()
        for part in text.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
            if not m:
                raise RecomputeError(f"bad layer list {spec!r} (at {part!r})", "use e.g. 3,7-9, all, none or auto:15%")
            a, b = int(m.group(1)), int(m.group(2) or m.group(1))
            if b < a:
                raise RecomputeError(f"bad layer range {part.strip()!r}", "write ranges low-high, e.g. 7-9")
            layers.update(range(a, b + 1))
        layers = tuple(sorted(layers))
    bad = [x for x in layers if not 0 <= x < num_layers]
    if bad:
        raise RecomputeError(
            f"layer {bad[0]} does not exist: the target has {num_layers} layers (0..{num_layers - 1})",
            f"pick layers between 0 and {num_layers - 1}",
        )
    return layers


def budget_count(share: float, num_layers: int) -> int:
    """Layers allowed by a share: rounded down (a budget is a ceiling), e.g. 15% of 30 = 4."""
    return int(math.floor(share * num_layers + 1e-9))


def groups_of(layers) -> list[tuple[int, int]]:
    """Contiguous runs ``[(first, last), ...]`` of a sorted layer set."""
    out = []
    for x in sorted(layers):
        if out and x == out[-1][1] + 1:
            out[-1] = (out[-1][0], x)
        else:
            out.append((x, x))
    return out


# -- hidden states ---------------------------------------------------------------------------------
def capture_hidden(model, fn):
    """``(fn(), inputs)``: ``inputs[i]`` = the hidden states entering decoder layer ``i`` during ``fn``."""
    layers = parts_of(model).layers
    seen: dict = {}

    def hook(i, mod, args, kwargs):
        seen[i] = (args[0] if args else kwargs["hidden_states"]).detach()

    handles = [layer.register_forward_pre_hook(partial(hook, i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        out = fn()
    finally:
        for h in handles:
            h.remove()
    return out, [seen.get(i) for i in range(len(layers))]


class _Stop(Exception):
    pass


def target_forward_until(model, ids: torch.Tensor, last: int):
    """The target's own prefill of ``ids`` stopped after layer ``last``: ``{layer: (K, V)}`` for 0..last."""
    from transformers import DynamicCache

    def stop(mod, args, out):
        raise _Stop

    handle = parts_of(model).layers[last].register_forward_hook(stop)
    cache = DynamicCache()
    try:
        with torch.no_grad():
            model(input_ids=ids, cache=cache, use_cache=True)
    except _Stop:
        pass
    finally:
        handle.remove()
    return {i: (cache.layers[i].keys, cache.layers[i].values) for i in range(last + 1)}


# -- the recompute -----------------------------------------------------------------------------------
def recompute_layers(model, state, layers, *, mode: str = "target", source_hidden=None):
    """``(state', Cost)``: ``state`` (a target-geometry cache of its ``token_ids``) with ``layers`` recomputed.

    ``layers``: a tuple of layer indices (see :func:`parse_layers`). ``mode``: ``"target"`` or
    ``"source"`` (then ``source_hidden[i]`` = the source's hidden states entering layer ``i``,
    ``[B, T, hidden]``, e.g. from :func:`capture_hidden` around the source's extraction).
    """
    layers = tuple(sorted(set(int(x) for x in layers)))
    ids = state.token_ids
    b, t = ids.shape
    full = b * prefill_flops(model, t)
    if not layers:
        return state, Cost(full_prefill_flops=full, note="nothing recomputed: the state is returned as it is")
    if mode not in ("target", "source"):
        raise RecomputeError(f"unknown recompute mode {mode!r}", "use target or source")
    keys, values = list(state.keys), list(state.values)
    t0 = time.perf_counter()
    if mode == "target":
        last = layers[-1]
        got = target_forward_until(model, ids, last)
        for i in layers:
            keys[i], values[i] = got[i][0].to(keys[i].dtype), got[i][1].to(values[i].dtype)
        run = tuple(range(last + 1))
        note = f"target forward over layers 0..{last}"
    else:
        if source_hidden is None:
            raise RecomputeError(
                "mode 'source' needs the source's hidden states",
                "pass source_hidden (capture_hidden around the source's extraction) or use mode target",
            )
        width = model.config.hidden_size
        store = RowStore(keys, values, state.positions)
        rows = torch.arange(t, device=ids.device).expand(b, t)
        for first, last in groups_of(layers):
            if first == 0:
                h = embed(model, ids)
            else:
                h = source_hidden[first]
                if h is None or h.shape[-1] != width:
                    raise RecomputeError(
                        f"the source's hidden states entering layer {first} have width "
                        f"{None if h is None else h.shape[-1]}, the target's layers take {width}",
                        "use --recompute-mode target (the target's own forward) for pairs of different width",
                    )
                h = h.to(next(model.parameters()).dtype)
            run_layers(model, range(first, last + 1), h, rows, store)
        keys, values = store.keys, store.values
        run = layers  # the groups cover exactly the recomputed layers
        note = "source hidden states at each group entry, target layers within the group"
    seconds = time.perf_counter() - t0
    flops = b * sum(layer_flops(model, i, t, causal_pairs(t)) for i in run)
    partial_recompute = len(layers) < state.num_layers
    out = with_kv(state, keys, values, partial_recompute, {"recomputed_layers": list(layers), "recompute_mode": mode})
    return out, Cost(
        flops=flops,
        seconds=seconds,
        full_prefill_flops=full,
        layers_run=run,
        rows_per_layer=tuple(t for _ in run),
        note=note,
    )


def mixed_state(native, mapped, layers):
    """``mapped`` with ``layers`` taken from ``native`` (what a target-mode recompute produces)."""
    keep = set(layers)
    return replace(
        mapped,
        keys=tuple(n if i in keep else m for i, (n, m) in enumerate(zip(native.keys, mapped.keys))),
        values=tuple(n if i in keep else m for i, (n, m) in enumerate(zip(native.values, mapped.values))),
    )


# -- profiling -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """Native and mapped caches of calibration prefixes, their continuations and native log-probs."""

    natives: tuple
    mappeds: tuple
    conts: tuple
    ref_logps: tuple

    @property
    def num_layers(self) -> int:
        return self.natives[0].num_layers


def calibration(
    source, target, mapping, samples, prefix_len: int, continuation_len: int, *, batch_size: int = 16, host=None
) -> Calibration:
    """The native and mapped caches of ``samples``' prefixes (shared prefills of
    :class:`~kvbridge.evaluate.runner.Prefills`), their continuations and native log-probs."""
    from kvbridge.evaluate.runner import Prefills, prefix_batches

    pre = Prefills(source, target, mapping, host=host)
    natives, mappeds, conts, refs = [], [], [], []
    for bt in prefix_batches(torch.as_tensor(samples).long(), prefix_len, continuation_len, batch_size, pre.timing):
        natives.append(pre.native(bt))
        mappeds.append(pre.transferred(bt))
        conts.append(bt.inputs)
        refs.append(_logp(target, pre.tad, natives[-1], bt.inputs))
    return Calibration(tuple(natives), tuple(mappeds), tuple(conts), tuple(refs))


def _logp(model, adapter, state, cont):
    with torch.no_grad():
        logits = model(input_ids=cont, cache=adapter.inject(state, model, check=False), use_cache=True).logits
    return torch.log_softmax(logits.double(), -1)


def loss_with(model, calib: Calibration, layers, host=None) -> float:
    """Mean KL(native || x) over calibration continuations when ``layers`` are native, the rest mapped."""
    adapter = adapter_of(model, host)
    total, count = 0.0, 0
    for native, mapped, cont, ref in zip(calib.natives, calib.mappeds, calib.conts, calib.ref_logps):
        logp = _logp(model, adapter, mixed_state(native, mapped, layers), cont)
        kl = (ref.exp() * (ref - logp)).sum(-1)
        total += float(kl.sum())
        count += kl.numel()
    return total / max(1, count)


def profile_layers(model, calib: Calibration, host=None) -> list[float]:
    """Per layer: the loss when only that layer comes from the mapping (every other layer native)."""
    n = calib.num_layers
    return [loss_with(model, calib, set(range(n)) - {i}, host=host) for i in range(n)]


def greedy_groups(model, calib: Calibration, budget: int, *, group_size: int = 1, host=None) -> list[dict]:
    """DroidSpeak-style greedy search: add the group whose recompute lowers the loss most, ``budget`` layers in all.

    Layers are cut into contiguous groups of ``group_size``; each step tries every group not yet
    chosen that still fits the budget. Returns the steps: ``{"group", "layers", "loss"}``.
    """
    n = calib.num_layers
    groups = [tuple(range(i, min(n, i + group_size))) for i in range(0, n, group_size)]
    chosen: set = set()
    steps = [{"group": None, "layers": [], "loss": loss_with(model, calib, (), host=host)}]
    while True:
        options = [g for g in groups if not set(g) & chosen and len(chosen) + len(g) <= budget]
        if not options:
            return steps
        scored = [(loss_with(model, calib, chosen | set(g), host=host), g) for g in options]
        loss, best = min(scored, key=lambda x: x[0])
        chosen |= set(best)
        steps.append({"group": list(best), "layers": sorted(chosen), "loss": loss})


def choose_layers(
    spec, model, calib: Calibration | None = None, *, method: str = "greedy", group_size: int = 1, host=None
):
    """``(layers, info)`` for a spec: names pass through; ``auto:X`` runs the profiling pass on ``calib``."""
    n = model.config.num_hidden_layers
    parsed = parse_layers(spec, n)
    if not (parsed and parsed[0] == "auto"):
        return parsed, {"method": "named", "spec": str(spec)}
    if calib is None and method != "prefix":
        raise RecomputeError(
            f"layer budget {spec!r} needs calibration samples to profile the layers",
            "pass calibration data (the CLI takes it from the corpus's front)",
        )
    k = budget_count(parsed[1], n)
    sets, measured = layer_sets(model, calib, k, method=method, group_size=group_size, host=host)
    info = {"method": method, "spec": str(spec), "budget_layers": k, "share": parsed[1], **measured}
    return (sets[-1] if sets else ()), info


def layer_sets(model, calib, k: int, *, method: str = "greedy", group_size: int = 1, host=None):
    """``(sets, measured)``: the nested layer sets a ``method`` chooses for 1..``k`` layers (``prefix``:
    ``0..j-1``, the cheapest in target mode; ``profile``: the worst single layers; else the greedy group
    search, one set per step), and what the choice measured on ``calib``."""
    if method == "prefix":
        return [tuple(range(j)) for j in range(1, k + 1)], {}
    if method == "profile":
        ranks = profile_layers(model, calib, host=host)
        order = sorted(range(model.config.num_hidden_layers), key=lambda i: -ranks[i])
        return [tuple(sorted(order[:j])) for j in range(1, k + 1)], {"single_layer_loss": ranks}
    steps = greedy_groups(model, calib, k, group_size=group_size, host=host)
    return [tuple(s["layers"]) for s in steps[1:]], {"greedy_steps": steps}


__all__ = [
    "RecomputeError",
    "parse_layers",
    "budget_count",
    "groups_of",
    "capture_hidden",
    "target_forward_until",
    "recompute_layers",
    "mixed_state",
    "Calibration",
    "calibration",
    "loss_with",
    "profile_layers",
    "greedy_groups",
    "choose_layers",
    "layer_sets",
]
