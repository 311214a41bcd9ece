"""Build tooling of a kvbridge checkout (not shipped in the package): the zoo's build
(``python -m tools.zoo.build``), the shipped LoRA's recipe (``python -m tools.train_lora``) and
the plugin page's generator (``python -m tools.plugin_docs > docs/plugins.md``). Run from the
repository root; they import the library, the library never imports them."""
