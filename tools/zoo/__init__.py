"""The zoo's recipes, trainer and build (``python -m tools.zoo.build``); the shipped weights and
their loader stay in :mod:`kvbridge.zoo`."""
