"""Quality gates: thresholds on a condition's metrics, reported PASS/FAIL.

A gate is written ``[CONDITION.]METRIC OP VALUE`` with ``OP`` one of ``<=``, ``>=``, ``<``,
``>``, or ``=`` (meaning "at least as good as": ``>=`` for a metric where higher is better,
``<=`` otherwise). The condition defaults to ``transferred``. Examples::

    kl_p95<=0.2   attention_cosine_min=0.9   transferred.gap_recovered>=0.5   default

``default`` stands for :data:`DEFAULT_GATES` (the thresholds the field's reference
implementation gates on: next-token KL p95 <= 0.2 and attention-output cosine min >= 0.9).

The default gates are always *reported*; the exit status of ``kvbridge eval`` follows only
the gates given with ``--gate`` (``--gate default`` enforces the defaults). A gate whose value
is not a number (nan: the metric does not apply) fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvbridge.errors import KVBridgeError, did_you_mean

DEFAULT_GATES = ("kl_p95<=0.2", "attention_cosine_min>=0.9")
#: exit status of ``kvbridge eval`` when an enforced gate fails
GATE_FAILED_EXIT = 1

_RE = re.compile(
    r"^\s*(?:(?P<cond>[A-Za-z_][\w]*)\.)?(?P<metric>[A-Za-z_][\w]*)\s*(?P<op><=|>=|==|=|<|>)\s*"
    r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)


class GateError(KVBridgeError):
    """A gate cannot be parsed or names an unknown metric."""


@dataclass(frozen=True)
class Gate:
    metric: str
    op: str
    threshold: float
    condition: str = "transferred"
    enforced: bool = False

    @property
    def key(self) -> tuple:
        return (self.condition, self.metric)

    def text(self) -> str:
        return f"{self.condition}.{self.metric}{self.op}{self.threshold:g}"

    def check(self, value) -> bool:
        if value is None or value != value:
            return False
        v, t = float(value), self.threshold
        return {"<=": v <= t, ">=": v >= t, "<": v < t, ">": v > t}[self.op]


def parse_gate(text: str, higher_is_better: dict | None = None, *, enforced: bool = False) -> list[Gate]:
    """The gate(s) ``text`` stands for (``default`` gives the defaults)."""
    if text.strip().lower() == "default":
        return [g for t in DEFAULT_GATES for g in parse_gate(t, higher_is_better, enforced=enforced)]
    m = _RE.match(text)
    if not m:
        raise GateError(f"cannot read gate {text!r}", "write NAME=VALUE or NAME<=VALUE, e.g. --gate kl_p95=0.2")
    metric, op, value = m["metric"], m["op"], float(m["value"])
    hib = higher_is_better or {}
    if hib and metric not in hib:
        raise GateError(
            f"gate {text!r} names unknown metric {metric!r}",
            f"{did_you_mean(metric, hib)}metrics: {', '.join(sorted(hib))}",
        )
    if op in ("=", "=="):
        op = ">=" if hib.get(metric, False) else "<="
    return [Gate(metric, op, value, m["cond"] or "transferred", enforced)]


def gate_set(given=(), higher_is_better: dict | None = None) -> list[Gate]:
    """Default gates (reported) overridden / extended by the ``given`` ones (enforced)."""
    gates = {g.key: g for t in DEFAULT_GATES for g in parse_gate(t, higher_is_better)}
    gates.update((g.key, g) for t in given for g in parse_gate(t, higher_is_better, enforced=True))
    return list(gates.values())


def evaluate_gates(summary: dict, gates: list[Gate]) -> list[dict]:
    """One record per gate: ``{gate, condition, metric, op, threshold, value, passed, enforced}``."""
    conds = summary.get("conditions", {})
    values = [conds.get(g.condition, {}).get(g.metric) for g in gates]
    return [
        {
            "gate": g.text(),
            "condition": g.condition,
            "metric": g.metric,
            "op": g.op,
            "threshold": g.threshold,
            "value": value,
            "passed": g.check(value),
            "enforced": g.enforced,
        }
        for g, value in zip(gates, values)
    ]


def exit_code(results: list[dict]) -> int:
    """0 unless an enforced gate failed."""
    return GATE_FAILED_EXIT if any(r["enforced"] and not r["passed"] for r in results) else 0
