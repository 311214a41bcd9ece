"""What differs between the transformers releases kvbridge runs on (no import of transformers here).

transformers renamed the cache argument of ``forward`` / ``generate`` from ``past_key_values`` to
``cache`` (5.2x; the old name is deprecated until 5.40). kvbridge's pinned environment has the new
name; vLLM 0.32's environment pins ``transformers<5.20``, whose models only know
``past_key_values`` and swallow an unknown ``cache=`` into ``**kwargs`` without using it (a
silent prefill from scratch). :func:`cache_kwargs` names the cache the way ``model`` takes it;
:func:`accept_cache_keyword` makes a loaded model of the older release take ``cache=`` as well (the
one loader applies it), so every ``model(..., cache=...)`` call below means what it says there too.
"""

from __future__ import annotations

import functools
import inspect


@functools.lru_cache(maxsize=64)
def _cache_name(forward_type: type) -> str:
    params = inspect.signature(forward_type.forward).parameters
    return "cache" if "cache" in params or "past_key_values" not in params else "past_key_values"


def cache_name(model) -> str:
    """``"cache"`` or ``"past_key_values"``: the keyword ``model``'s forward takes its KV cache by."""
    return _cache_name(type(model))


def cache_kwargs(model, cache) -> dict:
    """``{name: cache}`` for ``model(**...)`` / ``model.generate(**...)`` in either transformers."""
    return {cache_name(model): cache}


def accept_cache_keyword(model):
    """``model`` itself, its ``forward`` taking ``cache=`` as ``past_key_values=`` where the installed
    transformers only knows the old name (an instance attribute; nothing changes on newer releases)."""
    if cache_name(model) == "cache":
        return model
    forward = model.forward

    @functools.wraps(forward)
    def renamed(*args, **kwargs):
        if "cache" in kwargs:
            if "past_key_values" in kwargs:
                raise TypeError("forward() got both cache= and past_key_values=")
            kwargs["past_key_values"] = kwargs.pop("cache")
        return forward(*args, **kwargs)

    model.forward = renamed
    return model
