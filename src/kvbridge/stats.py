"""Shared statistics (harness reports, steering evaluations, divergence analysis): accuracy with a Wilson interval, retention, floor-normalised
retention, gap closed, and paired differences between conditions (per-item scores, same items).

Definitions (``t`` transferred, ``T`` target native, ``S`` source alone, ``f`` the floor: the
task's chance level, e.g. 1/k for k choices, 0 for exact match):

- **retention** = ``t / T``: the share of the target's accuracy kept (undefined when T = 0);
- **floor-normalised retention** = ``(t - f) / (T - f)``: the same, above chance (undefined unless T > f);
- **gap closed** = ``(t - S) / (T - S)``: how much of the source-to-target gap the transfer
  recovers (undefined unless T > S: when the source is at least as good there is no gap). Retention alone overstates a transfer whose source is nearly
  as good as the target, so the report never shows one without the other.

Intervals: Wilson 95% for an accuracy; for differences and ratios a paired bootstrap over items
(the same resampled items for every condition), percentile 95%, resamples where a ratio is
undefined left out (their count is reported). Binary paired differences also carry the
discordant counts and an exact McNemar (binomial) two-sided p-value.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of ``successes / n`` (None for n = 0). Fractional successes
    (partial-credit scores) are used as they are."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / denom
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)
    hi = 1.0 if successes >= n else min(1.0, centre + half)
    return (lo, hi)


def ratio(num: float, den: float) -> float | None:
    return None if abs(den) < 1e-12 else num / den


def retention(t: float, target: float) -> float | None:
    return ratio(t, target)


def floor_retention(t: float, target: float, floor: float) -> float | None:
    """Undefined (None) unless the target is above the floor."""
    return ratio(t - floor, target - floor) if target - floor > 1e-12 else None


def gap_closed(t: float, target: float, source: float) -> float | None:
    """Undefined (None) unless the target is better than the source: with no gap to close, a
    transfer worse than both would otherwise read as closing more than the whole gap."""
    return ratio(t - source, target - source) if target - source > 1e-12 else None


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts (binomial, p = 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n)


def _pct(values) -> list | None:
    import numpy as np

    values = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if values.size == 0:
        return None
    lo, hi = np.quantile(values, [0.025, 0.975])
    return [float(lo), float(hi)]


def summarize(scores: dict, *, floor: float, bootstrap: int = 1000, seed: int = 0) -> dict:
    """Everything one task (or the pooled items) reports.

    ``scores``: condition -> per-item scores (lists of equal length, same items, in [0, 1]);
    ``floor``: the mean chance level of these items.
    """
    import numpy as np

    conds = list(scores)
    n = len(next(iter(scores.values()))) if scores else 0
    arr = {c: np.asarray(scores[c], dtype=float) for c in conds}
    out: dict = {"n": n, "floor": floor, "conditions": {}, "paired": {}}
    for c in conds:
        total = float(arr[c].sum())
        ci = wilson(total, n)
        out["conditions"][c] = {"accuracy": total / n if n else None, "correct": total, "n": n, "ci": ci and list(ci)}
    idx = np.random.default_rng(seed).integers(0, n, size=(bootstrap, n)) if n and bootstrap else None
    means = {c: (arr[c][idx].mean(axis=1) if idx is not None else None) for c in conds}
    acc = {c: out["conditions"][c]["accuracy"] for c in conds}

    def with_ci(point, fn, *cs):
        if point is None or idx is None or any(c not in conds for c in cs):
            return {"value": point, "ci": None, "undefined_resamples": None}
        reps = [fn(*(float(means[c][r]) for c in cs)) for r in range(bootstrap)]
        return {"value": point, "ci": _pct(reps), "undefined_resamples": sum(v is None for v in reps)}

    if "transferred" in conds and "target" in conds and n:
        t, tg = acc["transferred"], acc["target"]
        out["retention"] = with_ci(retention(t, tg), retention, "transferred", "target")
        out["floor_normalised_retention"] = with_ci(
            floor_retention(t, tg, floor), lambda a, b: floor_retention(a, b, floor), "transferred", "target"
        )
        if "source" in conds:
            out["gap_closed"] = with_ci(gap_closed(t, tg, acc["source"]), gap_closed, "transferred", "target", "source")
    # per-condition ratios for the other cache conditions (plain reuse, recompute points)
    out["by_condition"] = {}
    for c in conds:
        if c in ("target", "source", "no_context") or "target" not in conds or not n:
            continue
        out["by_condition"][c] = {
            "retention": retention(acc[c], acc["target"]),
            "floor_normalised_retention": floor_retention(acc[c], acc["target"], floor),
            "gap_closed": gap_closed(acc[c], acc["target"], acc["source"]) if "source" in conds else None,
        }
    for a, b in paired_names(conds):
        d = arr[a] - arr[b]
        rec = {
            "diff": float(d.mean()) if n else None,
            "ci": _pct((means[a] - means[b]).tolist()) if idx is not None else None,
        }
        binary = all(set(np.unique(arr[x]).tolist()) <= {0.0, 1.0} for x in (a, b))
        if binary and n:
            bb, cc = int(((arr[a] == 1) & (arr[b] == 0)).sum()), int(((arr[a] == 0) & (arr[b] == 1)).sum())
            rec.update(a_only=bb, b_only=cc, mcnemar_p=mcnemar_p(bb, cc))
        out["paired"][f"{a}-{b}"] = rec
    return out


def paired_names(conds) -> list[tuple[str, str]]:
    """The paired differences a report shows: each transferred-like condition against the target,
    the source and no context; the target against the source; transferred against plain reuse; each
    frontier point ``tail@R`` against ``truncated@R``."""
    cached = [c for c in conds if c not in ("target", "source", "no_context")]
    pairs = [(c, ref) for c in cached for ref in ("target", "source", "no_context") if ref in conds]
    if "target" in conds and "source" in conds:
        pairs.append(("target", "source"))
    if "transferred" in conds:
        pairs += [(c, "transferred") for c in cached if c != "transferred"]
    # the compute frontier: each tail@R against the target's own compute at that point, truncated@R
    pairs += [(c, "truncated@" + c[5:]) for c in cached if c.startswith("tail@") and "truncated@" + c[5:] in conds]
    return pairs
