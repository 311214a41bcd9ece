"""The demo pipeline (``kvbridge demo`` is a thin layer over it), as a list of sections.

1. ``identity`` (:mod:`kvbridge.demo.identity`): identity transfer exact on every built-in
   family (tiny models built from configs);
2. ``zoo`` (:mod:`kvbridge.demo.zoo`): check -> fit -> eval on the embedded trained zoo;
3. ``real`` (:mod:`kvbridge.demo.real`): the real pretrained model (``smollm2``): identity
   exactness in float32 and bfloat16 against its own cached-vs-recompute noise, the exact-token
   split of its chat template, a prefix pack restored with zero forward passes. Its parts are
   the list :data:`kvbridge.demo.real.REAL_SECTIONS`; add one with
   :func:`kvbridge.demo.real.add_real_section`;
4. ``adapter`` (:func:`kvbridge.demo.real.adapter_section`, opt-in): the real adapter pair,
   SmolLM2 -> SmolLM2 + the shipped Shakespeare LoRA: check, fit, eval (minutes on 2 cores);
5. ``pair`` (:mod:`kvbridge.demo.pair`, opt-in): the real family pair Qwen2.5-Coder 0.5B -> 1.5B,
   check, identity on each, a short fit and the transfer against the 0.5B alone.

The default (:data:`DEFAULT_SECTIONS`) is sized to end within 3 minutes on 2 CPU cores
(``bench/bench_demo.py`` checks it); the opt-in sections are what does not fit.

:data:`SECTIONS` maps a section name to ``"module:function"``; :func:`run_section` imports it
on use. Each function takes keyword options and returns True when everything it checks holds
(the zoo section reports measurements and returns True unless it fails outright).
"""

from __future__ import annotations

from typing import Any

from kvbridge.plugin_types import load_object

#: section name -> "module:function", in the order ``kvbridge demo`` runs them
SECTIONS: dict[str, str] = {
    "identity": "kvbridge.demo.identity:identity_section",
    "zoo": "kvbridge.demo.zoo:zoo_section",
    "real": "kvbridge.demo.real:real_section",
    "adapter": "kvbridge.demo.real:adapter_section",
    "pair": "kvbridge.demo.pair:pair_section",
}
#: what ``kvbridge demo`` runs without ``--sections``, within 3 minutes on 2 cores (``adapter`` and
#: ``pair`` are opt-in: minutes each, and the pair is 1.6 GB to fetch)
DEFAULT_SECTIONS: tuple = ("identity", "zoo", "real")
#: the demo's time budget on 2 CPU cores (``bench/bench_demo.py`` fails the default above it)
BUDGET_SECONDS = 180.0


def run_section(name: str, **options: Any) -> Any:
    """Run one section by name with its keyword options."""
    return load_object(SECTIONS[name])(**options)


__all__ = ["SECTIONS", "DEFAULT_SECTIONS", "BUDGET_SECONDS", "run_section"]
