"""Hand a KV state to ``generate``: the cache covers all but the last prompt token.

``generate`` feeds ``input_ids[:, cache_len:]``; if the cache covered every id it would
silently re-feed them. So the hand-off withholds the last prompt token (the target consumes
it), checks that the cached token ids are a prefix of the prompt, and injects a fresh
cache that never aliases the state's tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbridge.errors import StateError
from kvbridge.hf_compat import cache_kwargs
from kvbridge.plugins import host_or_default

if TYPE_CHECKING:  # pragma: no cover
    from kvbridge.kvstate import KVState


def prepare_cache(model, state: "KVState", input_ids, *, host=None):
    """``(cache, input_ids)`` ready for ``model.generate(input_ids, cache=cache)``."""
    import torch

    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    n = state.num_tokens
    if ids.shape[0] != state.batch_size:
        raise StateError(
            f"prompt batch {ids.shape[0]} != state batch {state.batch_size}", "pass one prompt per cached sequence"
        )
    if n > ids.shape[1] or not torch.equal(state.token_ids.to(ids.device), ids[:, :n]):
        common = min(n, ids.shape[1])
        diff = (state.token_ids[:, :common].to(ids.device) != ids[:, :common]).nonzero()
        where = int(diff[0, 1]) if len(diff) else common
        raise StateError(
            f"cached token ids are not a prefix of the prompt (first difference at token {where})",
            "prefix the prompt with exactly the ids the state was computed from (see `kvbridge split`)",
        )
    if n == ids.shape[1]:
        state = state.slice_tokens(0, n - 1)  # withhold the last prompt token
    if state.num_tokens == 0:
        return None, ids
    return host_or_default(host).adapter_of(model).inject(state, model), ids


def greedy_kwargs(ids, new_tokens: int) -> dict:
    """``generate()`` keywords of a greedy continuation of ``ids`` (unpadded) that returns its logits."""
    import torch

    return dict(
        max_new_tokens=new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        attention_mask=torch.ones_like(ids),
        pad_token_id=0,
    )


def generate(model, state: "KVState", input_ids, *, host=None, **generate_kwargs):
    """``model.generate`` continuing from ``state`` (which must cover a prefix of ``input_ids``)."""
    return generate_from(model, *prepare_cache(model, state, input_ids, host=host), **generate_kwargs)


def generate_from(model, cache, ids, **generate_kwargs):
    """``model.generate`` of ``ids`` with ``cache`` (a prepared hand-off's, or None) injected."""
    import torch

    generate_kwargs.setdefault("attention_mask", torch.ones_like(ids))
    if cache is not None:
        generate_kwargs.update(cache_kwargs(model, cache))
    return model.generate(input_ids=ids, **generate_kwargs)
