"""Built-in compatibility findings: known-degrading situations a plain axis check cannot see.

Registered as an ordinary plugin (``kvbridge_check_compatibility``), exactly as a third-party
plugin would add its own findings. Pure python: no torch. The published figures quoted come
from the project's anchors (Heo et al., "Cross-Model KV Cache Transfer in LLM Families", and
independent re-runs of it).

Findings (axis names are stable, so tooling can filter on them):

- ``known-results`` (warning): the pair resembles one where ridge transfer is published to
  degrade: Ministral-3 (3B->14B kept 44%), or a large size gap (Llama-3.1 8B->70B kept 72.8%,
  GSM8K only 18.2%; Qwen3 8B->32B 87.5% against 97.6% for 14B->32B);
- ``cross-family`` (info): different model types; the published results are all within one family;
- ``sliding-history`` (warning): source sliding-window layers sit at the same relative depth
  as target full-attention layers, which need the whole history;
- ``calibration`` (info): a fitted mapping is needed; how many calibration observations the
  per-head ridge needs so it is not underdetermined;
- ``position-range`` (info): the target was trained on fewer positions than the source.
"""

from __future__ import annotations

from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Finding
from kvbridge.spec import FULL, SLIDING

#: model types of Mistral's Ministral-3 family, on which ridge transfer is reported to fail
MINISTRAL3_TYPES = frozenset({"ministral3", "ministral", "mistral3"})
#: size ratio (hidden_size x layers) from which published transfers degrade clearly
SIZE_GAP = 2.0
#: default number of source layers a fitted mapping reads per target layer (top-k)
from kvbridge.fit.settings import DEFAULT_TOP_K as TOP_K, MIN_OBS_PER_FEATURE  # what `fit` uses


def known_results(source, target) -> list[Finding]:
    out = []
    if source.model_type in MINISTRAL3_TYPES or target.model_type in MINISTRAL3_TYPES:
        out.append(
            Finding(
                "known-results",
                "warning",
                "ridge transfer is published to fail on Ministral-3 (3B->14B kept 44% retention):"
                " validate with a quality report before relying on it",
                source.model_type,
                target.model_type,
            )
        )
    s_size, t_size = (spec.hidden_size * spec.num_layers for spec in (source, target))
    if s_size and t_size and max(s_size, t_size) >= SIZE_GAP * min(s_size, t_size):
        ratio = max(s_size, t_size) / min(s_size, t_size)
        out.append(
            Finding(
                "known-results",
                "warning",
                f"large size gap ({ratio:.1f}x in hidden x layers): published ridge transfers degrade"
                " as the gap grows (Qwen3 14B->32B kept 97.6%, 8B->32B 87.5%, Llama-3.1 8B->70B 72.8%,"
                " GSM8K only 18.2%); retention also overstates the gap recovered",
                f"{source.hidden_size}x{source.num_layers}",
                f"{target.hidden_size}x{target.num_layers}",
            )
        )
    if source.model_type != target.model_type:
        out.append(
            Finding(
                "cross-family",
                "info",
                f"cross-family transfer ({source.model_type} -> {target.model_type}): published"
                " ridge results are all within one family; expect lower quality and measure it",
                source.model_type,
                target.model_type,
            )
        )
    return out


def sliding_history(source, target) -> list[Finding]:
    if not source.layer_types or SLIDING not in source.layer_types:
        return []
    s_types = source.layer_types
    t_types = target.layer_types or (FULL,) * target.num_layers
    ls, lt = len(s_types), len(t_types)

    def partner(j: int) -> int:  # the source layer at the same relative depth
        return j if ls == lt else round(j * (ls - 1) / max(1, lt - 1))

    full_targets = sum(1 for j, k in enumerate(t_types) if k == FULL and s_types[partner(j)] == SLIDING)
    if not full_targets:
        return []
    window = source.sliding_window
    return [
        Finding(
            "sliding-history",
            "warning",
            f"source sliding-window layers ({window}) feed {full_targets} full-attention target layers"
            " that need the whole history: extract with kvbridge (a plain DynamicCache keeps every"
            f" token; a cache taken from the source's generate() holds only the last {window}-1),"
            f" and expect keys past {window} tokens to have seen only their window",
            window,
            "full",
        )
    ]


def calibration(source, target) -> list[Finding]:
    keys = ("model_type", "num_layers", "num_kv_heads", "head_dim", "hidden_size")
    if all(getattr(source, k) == getattr(target, k) for k in keys):  # same geometry: nothing to fit
        return []
    features = source.num_kv_heads * source.head_dim * TOP_K
    return [
        Finding(
            "calibration",
            "info",
            f"a per-head ridge over the top-{TOP_K} source layers has {features} features"
            f" ({source.num_kv_heads} KV heads x {source.head_dim} dims x {TOP_K}): calibrate on at"
            f" least {MIN_OBS_PER_FEATURE}x more observations than that (fit warns below) and preferably many"
            " more (the paper used ~128K per head); an underdetermined fit reaches"
            " R^2 ~ 1 on calibration and collapses on held-out text",
            features,
            None,
        )
    ]


def position_range(source, target) -> list[Finding]:
    s_max, t_max = source.max_position_embeddings, target.max_position_embeddings
    if s_max and t_max and t_max < s_max:
        return [
            Finding(
                "position-range",
                "info",
                f"the target was trained on {t_max} positions, the source on {s_max}: keep transferred"
                f" prefixes within {t_max} tokens",
                s_max,
                t_max,
            )
        ]
    return []


CHECKS = (known_results, sliding_history, calibration, position_range)


@hookimpl
def kvbridge_check_compatibility(source, target):
    """Findings for known-degrading situations (see the module docstring)."""
    return [finding for check in CHECKS for finding in check(source, target)]
