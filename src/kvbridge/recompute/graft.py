"""Graft a chunk's cache prepared alone after other context, with or without token-selective recompute.

A chunk prepared on its own (a prefix pack, or :func:`prepare_chunk`: the target's prefill of
the chunk at positions ``0..n-1``) is moved after ``c`` context tokens by the exact RoPE
re-positioning (:meth:`KVState.reposition`) and appended to the context's cache. That is a
*naive graft*: the keys sit at the right positions, but the chunk's K/V at layers >= 1 were
computed without attending to the context (the seed notes' boundary: a prefix graft keeps causal
prefix semantics, an inserted chunk does not). :func:`kvbridge.recompute.tokens.blend` on
the grafted state adds token-selective recompute to it.

:func:`run_graft` runs the conditions on the same samples (context, chunk, continuation):

- ``full``: the target's prefill of context + chunk (the ceiling);
- ``naive``: context prefilled, chunk prepared alone and re-positioned;
- ``blend@R``: naive + token-selective recompute of R of the chunk's tokens (deviation rule);
- ``random@R``: the same cost with random tokens recomputed (control for the rule);
- ``first@R``: the same cost with the chunk's first tokens recomputed (where a chunk prepared alone
  keeps its attention sink; opt-in control);
- ``no_reposition``: the chunk appended with its keys still rotated at ``0..n-1`` (control);
- ``shuffled``: another sample's chunk grafted (control: right statistics, wrong content);
- ``dropped``: the context alone, the chunk left out (the floor).

Metrics are ``kvbridge eval``'s (:mod:`kvbridge.evaluate.metrics`) with ``full`` as native and
``dropped`` as the no-prefix floor, so ``gap_recovered = (NLL_dropped - NLL_x) / (NLL_dropped -
NLL_full)``; ``deficit_closed = (NLL_naive - NLL_x) / (NLL_naive - NLL_full)`` is the share of
what the naive graft misses that the recompute wins back. Intervals are paired bootstraps.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial

import torch

from kvbridge.evaluate.fields import summarize_fields
from kvbridge.evaluate.runner import Built, Condition, cat_states, prefix_batches, run_batches
from kvbridge.plugins import adapter_of
from kvbridge.progress import json_ready
from kvbridge.recompute.cost import prefill_flops
from kvbridge.recompute.settings import GraftSettings, RecomputeError
from kvbridge.recompute.tokens import blend

SCHEMA = "kvbridge-graft/1"


def prepare_chunk(model, chunk_ids, host=None):
    """The target's own cache of a chunk alone, at positions ``0..n-1`` (what a pack stores)."""
    ids = torch.as_tensor(chunk_ids).long()
    return adapter_of(model, host).extract(model, ids.reshape(-1, ids.shape[-1]))


def concat_states(first, second):
    """One state: ``first``'s rows then ``second``'s (same model and batch)."""
    if first.spec.num_layers != second.spec.num_layers or first.batch_size != second.batch_size:
        raise RecomputeError(
            "the context and the chunk come from different models or batch sizes",
            "prepare both with the same model, one chunk per context",
        )
    if [i for i, _ in first.indexer_keys] != [i for i, _ in second.indexer_keys]:
        raise RecomputeError(
            "the context and the chunk carry sparse-attention indexer keys of different layers",
            "prepare both with the same model",
        )
    cat = lambda a, b: torch.cat([a, b.to(a.dtype)], dim=2)
    lengths = None
    if first.rope_lengths is not None and second.rope_lengths is not None:
        lengths = torch.cat([first.rope_lengths, second.rope_lengths], dim=1)
    return replace(
        first,
        keys=tuple(cat(a, b) for a, b in zip(first.keys, second.keys)),
        values=tuple(cat(a, b) for a, b in zip(first.values, second.values)),
        token_ids=torch.cat([first.token_ids, second.token_ids], 1),
        positions=torch.cat([first.positions, second.positions], 1),
        rope_lengths=lengths,
        indexer_keys=tuple(
            (i, torch.cat([a, b.to(a.dtype)], dim=1))  # [B, T, D]: tokens on dim 1
            for (i, a), (_, b) in zip(first.indexer_keys, second.indexer_keys)
        ),
        approximate=first.approximate or second.approximate,
    )


def graft(context_state, chunk_state, *, reposition: bool = True, host=None):
    """The context's cache followed by the chunk's, re-positioned right after the context (exact RoPE)."""
    if chunk_state.spec.positional == "rope" and chunk_state.spec.rope and chunk_state.spec.rope.is_stateful:
        raise RecomputeError(
            f"{chunk_state.spec.model_type!r} uses stateful RoPE ({chunk_state.spec.rope.rope_type}): "
            "re-positioning is not exact there",
            "graft with a model whose RoPE is static",
        )
    c = context_state.num_tokens
    start = int(context_state.positions[0, -1]) + 1 if c else 0
    if reposition:
        offset = start - int(chunk_state.positions[0, 0])
        moved = chunk_state.reposition(offset, host=host) if offset else chunk_state
    else:
        moved = replace(chunk_state, positions=chunk_state.positions - chunk_state.positions[:, :1] + start)
    return replace(
        concat_states(context_state, moved),
        approximate=True,
        meta={
            **context_state.meta,
            "graft": {"context_tokens": c, "chunk_tokens": chunk_state.num_tokens, "repositioned": bool(reposition)},
        },
    )


def graft_and_continue(model, tokenizer, context_ids, chunk_state, prompt_ids, ratio, max_new_tokens, *, host=None):
    """``graft run``: ``chunk_state`` grafted after the context (naive, and blended at ``ratio``), ``prompt_ids``
    continued greedily for ``max_new_tokens`` from each and from a full prefill; first-token KL to the full
    prefill, greedy agreement steps and the three texts, as a JSON-ready dict."""
    adapter = adapter_of(model, host)
    ctx_state = adapter.extract(model, context_ids)
    grafted = graft(ctx_state, chunk_state, host=host)
    res = blend(model, grafted, ctx_state.num_tokens, ratio)
    full_ids = torch.cat([context_ids, chunk_state.token_ids, prompt_ids], 1)

    def greedy(state):
        cache = adapter.inject(state, model, check=False) if state is not None else None
        inp, toks, first = (prompt_ids if state is not None else full_ids), [], None
        with torch.no_grad():
            for _ in range(max_new_tokens):
                kw = {"cache": cache, "use_cache": True} if cache is not None else {}
                out = model(input_ids=inp, **kw)
                cache = out.past_key_values if cache is None else cache
                logits = out.logits[:, -1].double()
                first = torch.log_softmax(logits, -1) if first is None else first
                inp = logits.argmax(-1, keepdim=True)
                toks.append(int(inp))
        return toks, first

    runs = {k: greedy(state) for k, state in (("full", None), ("grafted", res.state), ("naive", grafted))}
    full_toks, full_lp = runs["full"]
    kl = lambda k: float((full_lp.exp() * (full_lp - runs[k][1])).sum())
    agree = lambda k: next((i for i, (a, b) in enumerate(zip(runs[k][0], full_toks)) if a != b), len(full_toks))
    return {
        "context_tokens": ctx_state.num_tokens,
        "chunk_tokens": chunk_state.num_tokens,
        "prompt_tokens": int(prompt_ids.shape[1]),
        "recompute_tokens": ratio,
        "recomputed": int(res.selected.shape[1]),
        "flop_share": res.cost.flop_share,
        "recompute_ms": 1e3 * res.cost.seconds,
        "first_token_kl": {k: kl(k) for k in ("naive", "grafted")},
        "greedy_agreement_steps": {"naive": agree("naive"), "grafted": agree("grafted"), "of": max_new_tokens},
        "text": {k: tokenizer.decode(runs[k][0]) for k in ("full", "naive", "grafted")},
    }


def condition_names(ratios, controls=("random", "no_reposition", "shuffled")) -> list[str]:
    names = ["full", "naive"] + [f"blend@{r:g}" for r in ratios if r > 0]
    names += [f"{rule}@{r:g}" for rule in ("random", "first") if rule in controls for r in ratios if 0 < r < 1]
    names += [c for c in ("no_reposition", "shuffled") if c in controls] + ["dropped"]
    return names


def run_graft(model, samples, settings=None, *, chunks=None, host=None, progress=None) -> dict:
    """Every graft condition on the same samples; a JSON-ready result (see the module docstring).

    ``samples``: ``(context_ids [N, c], chunk_ids [N, n], cont_ids [N, C + 1])`` (C scored predictions);
    ``settings``: a :class:`~kvbridge.recompute.settings.GraftSettings` (ratios, controls, check layer,
    batch size, bootstrap, seed, attention). ``chunks``: optional prepared chunk states (e.g. packs), one
    ``[1, n]`` state per sample; by default each chunk is prefilled alone here (not timed: it is
    prepared ahead).
    """
    st = settings if settings is not None else GraftSettings()
    controls, check_layer, batch_size, seed = st.control_names, st.check_layer, st.batch_size, st.seed
    adapter = adapter_of(model, host)
    context_ids, chunk_ids, cont_ids = (torch.as_tensor(x).long() for x in samples)
    n_samples, c, n = context_ids.shape[0], context_ids.shape[1], chunk_ids.shape[1]
    if chunk_ids.shape[0] != n_samples or cont_ids.shape[0] != n_samples or cont_ids.shape[1] < 2:
        raise RecomputeError(
            "context, chunk and continuation need the same number of samples and >= 2 continuation tokens",
            "pass [N, c], [N, n] and [N, C + 1] token ids",
        )
    if "shuffled" in controls and n_samples < 2:
        raise RecomputeError("the shuffled control needs at least 2 samples", "pass 2 or more samples")
    ratios = st.ratio_values
    names = condition_names(ratios, controls)
    gen = torch.Generator().manual_seed(int(seed))
    ids = torch.cat([context_ids, chunk_ids, cont_ids], 1)  # a batch's prefix (parts["prefix"]): context + chunk
    # one untimed pass of every code path: first calls allocate and dispatch slowly
    blend(model, adapter.extract(model, ids[:1, : c + n]), c, 0.5, check_layer=check_layer)
    timing = {"full": 0.0}

    def context(bt):
        return bt.once("context", lambda: adapter.extract(model, bt.parts["prefix"][:, :c]))

    def chunk(bt):
        if chunks is not None:
            return bt.once("chunk", lambda: cat_states([chunks[int(i)] for i in bt.index]))
        return bt.once("chunk", lambda: prepare_chunk(model, bt.parts["prefix"][:, c:], host=host))

    def naive(bt):  # (state, seconds of the re-positioning)
        def make():
            ctx_state, chunk_state = context(bt), chunk(bt)
            t0 = time.perf_counter()
            return graft(ctx_state, chunk_state, host=host), time.perf_counter() - t0

        return bt.once("naive", make)

    def recomputed(name, bt):  # RULE@R: the naive graft with R of the chunk's tokens recomputed
        rule, r = name.split("@")
        state, t_graft = naive(bt)
        rule = "deviation" if rule == "blend" else rule
        res = blend(model, state, c, float(r), check_layer=check_layer, rule=rule, generator=gen)
        return Built(res.state, seconds=t_graft + res.cost.seconds, flops=res.cost.flops)

    def shuffled(bt):
        idx, chk = bt.index, bt.parts["prefix"][:, c:]
        other = chk[torch.roll(torch.arange(len(idx)), 1)] if len(idx) > 1 else chunk_ids[(idx + 1) % n_samples]
        return Built(graft(context(bt), prepare_chunk(model, other, host=host), host=host))

    builders = {
        "full": lambda bt: Built(bt.once("full", lambda: adapter.extract(model, bt.parts["prefix"]), "full")),
        "naive": lambda bt: Built(naive(bt)[0], seconds=naive(bt)[1]),
        "no_reposition": lambda bt: Built(graft(context(bt), chunk(bt), reposition=False, host=host)),
        "shuffled": shuffled,
        "dropped": lambda bt: Built(context(bt)),
    }
    fields, cost = run_batches(
        [Condition(x, builders[x] if x in builders else partial(recomputed, x)) for x in names],
        prefix_batches(ids, c + n, cont_ids.shape[1] - 1, batch_size, timing),
        {"target": (model, adapter)},
        attention=st.attention,
        progress=progress,
        floor="dropped",
    )
    t_full = timing["full"]
    summary = summarize_fields(fields, bootstrap=st.bootstrap, seed=seed, reference="naive")
    full_flops = prefill_flops(model, c + n, batch=n_samples)
    for cond, row in summary["conditions"].items():
        row["recompute_flop_share"] = cost[cond]["flops"] / full_flops
        row["time_share"] = cost[cond]["seconds"] / t_full if t_full > 0 else None
        row["tokens_recomputed_share"] = 0.0 if cond == "naive" else float(cond.split("@")[1]) if "@" in cond else None
    summary["conditions"]["full"].update(recompute_flop_share=1.0, time_share=1.0)
    result = {
        "schema": SCHEMA,
        "samples": n_samples,
        "context_len": c,
        "chunk_len": n,
        "continuation_len": int(cont_ids.shape[1] - 1),
        "ratios": list(ratios),
        "check_layer": check_layer,
        "bootstrap": st.bootstrap,
        "seed": seed,
        "conditions": summary["conditions"],
        "timing": {"full_prefill_ms": 1e3 * t_full, "full_prefill_flops": full_flops},
        "notes": [
            "full = the target's prefill of context + chunk (ceiling); dropped = context alone (floor); "
            "time_share = (re-positioning + recompute) / full prefill, wall time on this machine; "
            "the chunk's own prefill is done ahead (a pack) and not counted"
        ],
    }
    return json_ready(result, stringify=False)
