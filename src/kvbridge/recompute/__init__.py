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
- :mod:`~kvbridge.recompute.curve`: quality/cost curves for ``kvbridge eval --recompute-*``;
  :mod:`~kvbridge.recompute.frontier`: the compute frontier (``--frontier``); both run in ``kvbridge eval``
  as the condition sets of :mod:`~kvbridge.recompute.eval_run`; their settings and the graft's are in
  :mod:`~kvbridge.recompute.settings`.

Importing this package imports nothing heavy.
"""

from __future__ import annotations

#: the public names, by the module that holds them (imported on first use)
_WHERE = {
    "layers": ("recompute_layers", "parse_layers", "profile_layers", "greedy_groups", "choose_layers"),
    "tokens": ("blend",),
    "graft": ("graft", "prepare_chunk", "run_graft"),
    "cost": ("Cost",),
    "settings": ("CurvePlan", "GraftSettings", "RecomputeError"),
}
__all__ = [name for names in _WHERE.values() for name in names]


def __getattr__(name):
    import importlib

    for module, names in _WHERE.items():
        if name in names:
            return getattr(importlib.import_module(f"kvbridge.recompute.{module}"), name)
    raise AttributeError(name)
