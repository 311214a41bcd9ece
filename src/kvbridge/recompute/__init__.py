"""Selective recompute: the dial between reusing a cache as it is and prefilling it again.

- :mod:`~kvbridge.recompute.runner`: run a model's decoder layers one at a time on any subset of
  token rows, against a K/V store that holds every other row (the primitive the rest builds on);
- :mod:`~kvbridge.recompute.cost`: FLOPs of a layer on given query rows, and the cost record;
- :mod:`~kvbridge.recompute.layers`: layer-selective recompute of a transferred cache (by name,
  by budget from a profiling pass, by greedy group search), with the target's own forward or
  the source's hidden states as the recomputed layers' input;
- :mod:`~kvbridge.recompute.tokens`: token-selective recompute (the CacheBlend rule);
- :mod:`~kvbridge.recompute.graft`: a chunk's cache prepared alone, re-positioned after other
  context, with or without token-selective recompute, and the graft conditions;
- :mod:`~kvbridge.recompute.curve`: quality/cost curves for ``kvbridge eval --recompute-*``.

Importing this package imports nothing heavy.
"""

from __future__ import annotations

__all__ = [
    "recompute_layers",
    "parse_layers",
    "profile_layers",
    "greedy_groups",
    "choose_layers",
    "blend",
    "graft",
    "prepare_chunk",
    "run_graft",
    "Cost",
]


def __getattr__(name):
    import importlib

    where = {
        "recompute_layers": "layers",
        "parse_layers": "layers",
        "profile_layers": "layers",
        "greedy_groups": "layers",
        "choose_layers": "layers",
        "blend": "tokens",
        "graft": "graft",
        "prepare_chunk": "graft",
        "run_graft": "graft",
        "Cost": "cost",
    }
    if name in where:
        return getattr(importlib.import_module(f"kvbridge.recompute.{where[name]}"), name)
    raise AttributeError(name)
