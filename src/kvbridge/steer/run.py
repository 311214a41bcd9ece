"""Steering one model run: the prefix state of a scenario, a method's plan on it, and the
side-by-side steered / unsteered continuation of ``kvbridge steer run``."""

from __future__ import annotations

from kvbridge.errors import KVBridgeError
from kvbridge.plugins import adapter_of
from kvbridge.plugins import host_or_default as _host


def prefix_state(model, ids, host=None):
    """The cache of ``ids`` (batch 1) as a KVState, or None for no ids."""
    import torch

    if not ids:
        return None
    return adapter_of(model, host).extract(model, torch.tensor([list(ids)], device=next(model.parameters()).device))


def check_length(model, scenario, new_tokens: int, host=None) -> None:
    """The scenario's tokens and ``new_tokens`` within the model's positions (as ``kvbridge transfer`` checks)."""
    from kvbridge.transfer_run import check_generation_length

    spec = adapter_of(model, host).spec_of(model)
    check_generation_length(len(scenario.joint), new_tokens, spec.max_position_embeddings)


def setup_for(
    model,
    scenario,
    *,
    method: str | None = None,
    options: dict | None = None,
    vector=None,
    other=None,
    layers=None,
    edit: tuple | None = None,
    prefix=None,
    host=None,
):
    """``(Setup, record)``: the scenario's prefix (``prefix`` when given, e.g. restored from a pack),
    steered by ``method`` at ``layers`` and positions ``edit`` (default: the scenario's)."""
    from kvbridge.steer.edit import layers_of
    from kvbridge.steer.methods import SteerContext, method_options
    from kvbridge.steer.sample import Setup

    host = _host(host)
    state = prefix if prefix is not None else prefix_state(model, scenario.prefix_ids, host)
    if method is None:
        return Setup(state, scenario.live_ids), {"method": "none"}
    if state is None:
        raise KVBridgeError("there is no cached prefix to steer", "pass a longer prompt")
    m = host.get("steering_method", method)
    opts = method_options(m, options)
    spec = adapter_of(model, host).spec_of(model)
    chosen = layers_of(layers, spec.num_layers)
    start, stop = edit or scenario.edit
    ctx = SteerContext(
        model=model, spec=spec, state=state, start=start, stop=stop, layers=chosen, vector=vector, other=other
    )
    plan = m.plan(ctx, opts)
    method = plan.record.get("method", m.name)
    record = {**plan.record, "method": method, "layers": list(chosen), "positions": [start, stop]}
    return Setup(plan.state, scenario.live_ids, plan.hooks), record


def side_by_side(left: str, right: str, *, width: int = 38, titles=("unsteered", "steered")) -> list[str]:
    """Two texts in two wrapped columns."""
    import textwrap
    from itertools import zip_longest

    def wrap(text):
        return [line for para in text.split("\n") for line in textwrap.wrap(para, width) or [""]]

    lines = [f"{titles[0]:<{width}} | {titles[1]}", f"{'-' * width}-+-{'-' * width}"]
    return lines + [f"{x:<{width}} | {y}" for x, y in zip_longest(wrap(left), wrap(right), fillvalue="")]


def decode(tokenizer, tokens, stop_ids=()) -> str:
    """The text of ``tokens`` up to the first of ``stop_ids``."""
    toks = list(tokens)
    cut = next((i for i, t in enumerate(toks) if t in stop_ids), len(toks))
    return tokenizer.decode(toks[:cut], skip_special_tokens=True)


def stop_ids_of(tokenizer, model=None) -> tuple:
    """End-of-turn / end-of-text ids: the tokenizer's eos, ``<|im_end|>`` and ``<|eot_id|>`` where they exist."""
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = [getattr(tokenizer, "eos_token_id", None), *(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])]
    out = {i for i in eos if isinstance(i, int)}
    unk = getattr(tokenizer, "unk_token_id", None)
    for name in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        try:
            i = tokenizer.convert_tokens_to_ids(name)
        except Exception:  # noqa: BLE001 - tokenizers without the name
            continue
        if isinstance(i, int) and i >= 0 and i != unk:
            out.add(i)
    return tuple(sorted(out))


def run_pair(model, tokenizer, base, steered, settings, host=None) -> dict:
    """The unsteered and steered continuation with the same seed, sampled as ``settings`` (a
    :class:`~kvbridge.steer.settings.SteerRunSettings`: ``max_new_tokens``, ``seed``, ``greedy``,
    ``temperature``, ``top_p``) say."""
    from kvbridge.divergence import kl
    from kvbridge.prefix.diverge import Sampler
    from kvbridge.steer.sample import sample

    s = settings
    sampler = None if s.greedy else Sampler(s.temperature, s.top_p)
    seeds = [0 if s.greedy else s.seed]
    stops = stop_ids_of(tokenizer, model)
    runs = {
        name: sample(model, setup, seeds, s.max_new_tokens, sampler, stop_ids=stops, host=host, return_logits=True)
        for name, setup in (("unsteered", base), ("steered", steered))
    }
    out = {
        name: {"tokens": r["tokens"][0], "text": decode(tokenizer, r["tokens"][0], stops)} for name, r in runs.items()
    }
    out["first_step_kl"] = float(kl(runs["unsteered"]["first_logits"][0], runs["steered"]["first_logits"][0]).sum())
    out["identical"] = out["unsteered"]["tokens"] == out["steered"]["tokens"]
    return out
