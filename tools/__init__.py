"""Build tooling of a kvbridge checkout (not shipped in the package): the zoo's build
(``python -m tools.zoo.build``), the shipped LoRA's recipe (``python -m tools.train_lora``),
the plugin page's generator (``python -m tools.plugin_docs > docs/plugins.md``) and the llamacpp
engine's end-to-end checks against a running llama.cpp (:mod:`tools.llamacpp_check`, which
``bench/bench_llamacpp.py`` and ``tests/real`` call). Run from the
repository root; they import the library, the library never imports them."""
