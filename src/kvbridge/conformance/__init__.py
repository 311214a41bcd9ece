"""Conformance of kvbridge against transformers' causal-LM registry (``kvbridge conformance``).

:mod:`.tiny` builds a tiny random model of any model type; :mod:`.sweep` classifies each type
(exact / refused / not-built / wrong / crash); :mod:`.report` renders the table of
``docs/supported-models.md``.
"""

from kvbridge.conformance.sweep import CLASSES, Result, run, run_type

__all__ = ["CLASSES", "Result", "run", "run_type"]
