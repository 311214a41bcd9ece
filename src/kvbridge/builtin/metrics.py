"""The built-in quality metrics, as one plugin (imports nothing heavy).

The list itself is :data:`kvbridge.evaluate.catalog.BUILTIN_METRICS` (it also orders the
report and writes the ``eval`` help); each factory is the function of the same name in
:mod:`kvbridge.evaluate.metrics`, taking an :class:`~kvbridge.evaluate.metrics.EvalView`, and
is imported only when ``kvbridge eval`` (or :func:`kvbridge.evaluate.evaluate`) computes metrics.
"""

from __future__ import annotations

from kvbridge.evaluate.catalog import BUILTIN_METRICS
from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Metric

METRICS = tuple(Metric(m.name, m.description, m.factory, m.higher_is_better) for m in BUILTIN_METRICS)


@hookimpl
def kvbridge_register_metrics(register):
    for metric in METRICS:
        register(metric)
