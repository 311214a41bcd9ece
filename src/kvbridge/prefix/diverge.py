"""Divergence analysis: full recompute vs cached vs split vs concat, same seeds, same sampler.

Four execution paths produce a continuation of ``guide + sep + prompt``:

- ``full``: no cache; every step runs the whole visible sequence (joint ids + generated) again,
- ``cached``: the visible joint ids prefilled once, then cached one-token decode steps,
- ``split``: the guide restored from a prefix pack (no forward pass), the live prompt prefilled
  after it, then cached decode,
- ``concat``: the split's exact token sequence (ghost + live) fed visibly, then cached decode.
  With the safe split this is the joint sequence; with ``split="naive"`` it is the naive one, so
  ``cached`` vs ``concat`` isolates the token-sequence effect and ``concat`` vs ``split`` the
  cache-execution effect.

Every path samples with one :class:`Sampler` (temperature, top-p) and a fresh
``torch.Generator`` per seed that gives exactly one uniform per step; the token is read from the
inverse CDF over token ids (not over a probability-sorted list), so two paths whose distributions
are identical draw identical tokens, and nearly identical distributions draw the same token
unless the uniform falls in the sliver where their CDFs differ. For every pair of paths and
every seed the report says whether the continuations are identical, or gives the first
divergence step and, at that step (where both histories are still the same), whether the argmax
agrees, the top-25 overlap, the max abs logit difference and the total-variation distance
between the post-top-p distributions. Greedy decoding gets the same comparison.

Summaries give counts with 95% Wilson intervals and say plainly when there are too few seeds
to estimate a rate (a handful of seeds shows *that* paths can separate, not *how often*).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Callable, Sequence

from kvbridge.divergence import first_divergence, nucleus, topk_overlap, tv_top_p
from kvbridge.errors import KVBridgeError, names_value
from kvbridge.plugins import adapter_of
from kvbridge.settings_fields import option

PATHS = ("full", "cached", "split", "concat")
TOP_K = 25
#: below this many seeds a rate is not estimated (counts only)
MIN_SEEDS_FOR_RATE = 20


# -- statistics -----------------------------------------------------------------------------------
def wilson_interval(successes: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (``(0, 1)`` for ``n == 0``)."""
    from kvbridge.stats import wilson

    return wilson(successes, n) or (0.0, 1.0)


# -- the sampler ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sampler:
    """Temperature + top-p (nucleus) sampling by inverse CDF over token ids, one uniform per step."""

    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise KVBridgeError(f"temperature must be > 0, got {self.temperature}", "use --greedy for argmax decoding")
        if not (0 < self.top_p <= 1):
            raise KVBridgeError(f"top-p must be in (0, 1], got {self.top_p}", "pass --top-p between 0 and 1")

    def probs(self, logits):
        """The post-temperature, post-top-p distribution (float64, renormalised) over the vocabulary
        (:func:`kvbridge.divergence.nucleus`: tokens tied at the edge of the nucleus are all kept)."""
        import torch

        p = torch.softmax(logits.double() / self.temperature, dim=-1)
        return nucleus(p, self.top_p) if self.top_p < 1.0 else p

    def draw(self, logits, generator) -> int:
        """The token of one logit row ``[V]``."""
        return self.draw_rows(logits[None], [generator])[0]

    def draw_rows(self, logits, generators) -> list[int]:
        """One token per row of ``logits [N, V]``, row ``i`` drawing its one uniform from ``generators[i]``."""
        import torch

        p = self.probs(logits)
        cdf = torch.cumsum(p, dim=-1)
        out = []
        for i, g in enumerate(generators):
            u = torch.rand((), generator=g, dtype=torch.float64)
            idx = min(int(torch.searchsorted(cdf[i], (u * cdf[i, -1]).reshape(1), right=True)[0]), p.shape[-1] - 1)
            while p[i, idx] == 0 and idx > 0:  # rounding at the top end: step back to a kept token
                idx -= 1
            out.append(idx)
        return out

    def to_dict(self) -> dict:
        return {
            "kind": "inverse-cdf over token ids, one uniform per step (torch.Generator per seed)",
            "temperature": self.temperature,
            "top_p": self.top_p,
        }


# -- trajectories ---------------------------------------------------------------------------------
@dataclass
class Trajectory:
    path: str
    tokens: list  # generated ids
    logits: Any  # Tensor [steps, vocab] float32: the distribution each token was drawn from


def _last_logits(out):
    return out.logits[0, -1].detach().float().cpu().clone()


class PathRunner:
    """Runs the four paths for one model and one token layout."""

    def __init__(self, model, joint: Sequence[int], ghost: Sequence[int], live: Sequence[int], pack, host=None):
        import torch

        self.model = model
        self.device = next(model.parameters()).device
        self.joint = torch.as_tensor([list(joint)], dtype=torch.long, device=self.device)
        self.split_ids = torch.as_tensor([list(ghost) + list(live)], dtype=torch.long, device=self.device)
        self.pack = pack
        self.host = host

    def run(self, path: str, pick: Callable, max_new_tokens: int) -> Trajectory:
        import torch
        from transformers import DynamicCache

        model, cache, seq = self.model, None, self.joint  # "full": no cache, the whole sequence every step
        tokens: list[int] = []
        rows = []
        with torch.no_grad():
            if path in ("cached", "concat"):
                cache, seq = DynamicCache(), self.joint if path == "cached" else self.split_ids
            elif path == "split":
                from kvbridge.handoff import prepare_cache

                cache, ids = prepare_cache(model, self.pack.state_for(model), self.split_ids, host=self.host)
                seq = ids[:, cache.get_seq_length() :] if cache is not None else ids
                cache = cache if cache is not None else DynamicCache()
            elif path != "full":
                raise KVBridgeError(f"unknown path {path!r}", f"use one of {', '.join(PATHS)}")
            for _ in range(max_new_tokens):  # prefill (or the whole sequence), then one token per step
                if cache is None:
                    logits = _last_logits(model(input_ids=seq, use_cache=False))
                else:
                    out = model(input_ids=seq, cache=cache, use_cache=True)
                    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None) or cache
                    logits = _last_logits(out)
                rows.append(logits)
                tokens.append(pick(logits))
                new = torch.tensor([[tokens[-1]]], device=self.device)
                seq = torch.cat([seq, new], dim=1) if cache is None else new
        return Trajectory(path, tokens, torch.stack(rows))


# -- comparisons ----------------------------------------------------------------------------------
def compare_trajectories(a: Trajectory, b: Trajectory, sampler: Sampler) -> dict:
    """Identical, or the first divergence step with the metrics at that step."""
    import torch

    n = min(len(a.tokens), len(b.tokens))
    first = first_divergence(a.tokens, b.tokens)
    upto = n if first is None else first + 1  # histories agree up to and including step `first`
    diffs = (a.logits[:upto] - b.logits[:upto]).abs().amax(dim=-1)
    out = {
        "identical": first is None,
        "first_divergence": first,
        "max_abs_logit_diff_shared_steps": float(diffs.max()) if upto else 0.0,
        "bitwise_equal_logits": bool(torch.equal(a.logits[:upto], b.logits[:upto])),
    }
    if first is not None:
        la, lb = a.logits[first], b.logits[first]
        out["at_divergence"] = {
            "step": first,
            "token_a": a.tokens[first],
            "token_b": b.tokens[first],
            "argmax_agree": int(la.argmax()) == int(lb.argmax()),
            "top25_overlap": int(topk_overlap(la, lb, TOP_K, share=False)),
            "max_abs_logit_diff": float((la - lb).abs().max()),
            "tv_post_top_p": float(tv_top_p(la, lb, sampler.top_p, temperature=sampler.temperature)),
        }
    return out


def summarise(results: list[dict], n_label: str = "seeds") -> dict:
    """Counts, a Wilson interval for P(identical), and what the divergence steps looked like."""
    n = len(results)
    same = sum(r["identical"] for r in results)
    lo, hi = wilson_interval(same, n)
    div = [r["at_divergence"] for r in results if not r["identical"]]
    out: dict = {
        "n": n,
        "identical": same,
        "diverged": n - same,
        "identical_rate_wilson95": [round(lo, 4), round(hi, 4)],
        "bitwise_equal_logits": sum(r["bitwise_equal_logits"] for r in results),
        "max_abs_logit_diff_shared_steps_max": max(
            (r["max_abs_logit_diff_shared_steps"] for r in results), default=0.0
        ),
    }
    if n < MIN_SEEDS_FOR_RATE:
        out["rate_note"] = (
            f"too few {n_label} (n={n}) to estimate a rate: these are counts of what happened, "
            f"not a success or divergence rate (the Wilson 95% interval "
            f"[{lo:.2f}, {hi:.2f}] shows how little {n} {n_label} pin down)"
        )
    else:
        out["rate_note"] = f"identical in {same}/{n} {n_label}; Wilson 95% interval [{lo:.3f}, {hi:.3f}]"
    if div:
        out["at_divergence"] = {
            "first_step_median": statistics.median(d["step"] for d in div),
            "first_step_min": min(d["step"] for d in div),
            "argmax_agree": sum(d["argmax_agree"] for d in div),
            "top25_overlap_min": min(d["top25_overlap"] for d in div),
            "top25_overlap_median": statistics.median(d["top25_overlap"] for d in div),
            "max_abs_logit_diff_median": statistics.median(d["max_abs_logit_diff"] for d in div),
            "max_abs_logit_diff_max": max(d["max_abs_logit_diff"] for d in div),
            "tv_post_top_p_median": statistics.median(d["tv_post_top_p"] for d in div),
            "tv_post_top_p_max": max(d["tv_post_top_p"] for d in div),
        }
    return out


# -- the analysis ---------------------------------------------------------------------------------
@dataclass
class DivergeReport:
    paths: tuple
    sampler: Sampler
    seeds: tuple
    max_new_tokens: int
    split: dict
    pairs: dict  # pair name -> {"seeds": [...], "summary": {...}}
    greedy: dict  # pair name -> comparison + tokens
    tokens: dict  # seed -> path -> tokens ; "greedy" -> path -> tokens
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:  # the fields in order, JSON-ready
        paths, seeds, tokens = list(self.paths), list(self.seeds), {str(k): v for k, v in self.tokens.items()}
        return {**vars(self), "paths": paths, "sampler": self.sampler.to_dict(), "seeds": seeds, "tokens": tokens}

    def lines(self) -> list[str]:
        s = self.split
        out = [
            f"split: {s['kind']} ({s['ghost_len']} + {s['live_len']} tokens; joint {s['joint_len']}; "
            f"ghost+live == joint: {'yes' if s['matches_joint'] else 'NO'})",
            f"sampler: temperature {self.sampler.temperature}, top-p {self.sampler.top_p}; "
            f"{len(self.seeds)} seeds x {self.max_new_tokens} new tokens",
        ]
        if self.seeds:
            out.append("sampled:")
            for name, data in self.pairs.items():
                sm = data["summary"]
                lo, hi = sm["identical_rate_wilson95"]
                line = f"  {name:<22} identical {sm['identical']}/{sm['n']} (Wilson95 {lo:.2f}-{hi:.2f})"
                if "at_divergence" in sm:
                    d = sm["at_divergence"]
                    line += (
                        f"; first divergence step median {d['first_step_median']}, argmax agreed "
                        f"{d['argmax_agree']}/{sm['diverged']}, top-25 overlap >= {d['top25_overlap_min']}, "
                        f"max|dlogit| <= {d['max_abs_logit_diff_max']:.3g}, TV <= {d['tv_post_top_p_max']:.3g}"
                    )
                else:
                    line += f"; max|dlogit| {sm['max_abs_logit_diff_shared_steps_max']:.3g}"
                out.append(line)
            first = next(iter(self.pairs.values()), None)
            if first and first["summary"]["n"] < MIN_SEEDS_FOR_RATE:
                out.append(f"  note: {first['summary']['rate_note']}")
        out.append("greedy:")
        for name, r in self.greedy.items():
            if r["identical"]:
                out.append(f"  {name:<22} identical (max|dlogit| {r['max_abs_logit_diff_shared_steps']:.3g})")
            else:
                d = r["at_divergence"]
                out.append(
                    f"  {name:<22} diverged at step {d['step']} (argmax agree {d['argmax_agree']}, "
                    f"top-25 overlap {d['top25_overlap']}, max|dlogit| {d['max_abs_logit_diff']:.3g}, "
                    f"TV {d['tv_post_top_p']:.3g})"
                )
        out.extend(f"note: {n}" for n in self.notes)
        return out


@dataclass(frozen=True)
class DivergeSettings:
    """What ``kvbridge diverge`` (and :func:`diverge`) is asked to do, one field per option; ``seeds``:
    a count (seeds ``0..N-1``) or the seeds themselves; ``paths``: a sequence, or the comma list the
    command line gives."""

    sep: str = option(" ", "Separator between guide and prompt (\\n escapes).", show_default=True)
    seeds: int | Sequence[int] = option(8, "Sampled seeds 0..N-1.", kind=("count", 0, 1_000_000), show_default=True)
    max_new_tokens: int = option(32, kind=("count", 1), show_default=True)
    temperature: float = option(1.0, kind=("real", 0, {"min_open": True}), show_default=True)
    top_p: float = option(0.95, kind="share", show_default=True)
    greedy_only: bool = option(False, "Greedy decoding only (no sampled seeds).", flags=("--greedy",), flag=True)
    split: str = option(
        "safe",
        "Token layout of the split and concat paths.",
        flags=("--split",),
        kind=("choice", ("safe", "naive")),
        show_default=True,
    )
    paths: Sequence[str] = option(PATHS, "Paths to compare.", cli_default=",".join(PATHS), show_default=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", names_value(self.paths, "--paths"))


def diverge(
    model,
    tokenizer,
    guide: str,
    prompt: str,
    settings: DivergeSettings | None = None,
    *,
    pack=None,
    host=None,
    progress=None,
    on_seed=None,
    **options: Any,
) -> DivergeReport:
    """Run every path for every seed (and greedily) and compare every pair (see the module docstring);
    ``settings`` (or its fields as keywords) say how.

    ``progress(done, total, tokens)`` after each seed (and the greedy run); ``on_seed(seed, results)``
    with the finished seed's pair comparisons (partial results: what a killed run keeps).
    """
    s = settings if settings is not None else DivergeSettings(**options)
    max_new_tokens, split, paths = s.max_new_tokens, s.split, s.paths
    import torch

    from kvbridge.prefix import packs
    from kvbridge.prefix.splits import split_text

    if max_new_tokens < 1:
        raise KVBridgeError(f"max-new-tokens must be >= 1, got {max_new_tokens}", "pass --max-new-tokens 1 or more")
    unknown = [p for p in paths if p not in PATHS]
    if unknown or len(paths) < 2:
        raise KVBridgeError(
            f"paths must be two or more of {', '.join(PATHS)}, got {list(paths)}", "pass e.g. --paths full,cached,split"
        )
    sampler = Sampler(s.temperature, s.top_p)
    seeds = range(s.seeds) if isinstance(s.seeds, int) else s.seeds  # a count: seeds 0..N-1
    seed_list = () if s.greedy_only else tuple(int(x) for x in seeds)
    report = split_text(tokenizer, guide, prompt, s.sep)
    chosen = report.get(split)  # "safe" raises unless ghost + live == joint, id for id (no exact split)
    spec = adapter_of(model, host).spec_of(model)
    longest = max(len(report.joint), len(chosen.ids)) + max_new_tokens
    packs.check_guide_length(len(chosen.ghost), spec, total=longest, new=max_new_tokens)
    notes: list[str] = []
    if pack is None:
        from kvbridge.models.fingerprint import tokenizer_identity

        pack = packs.round_trip(model, chosen.ghost, chosen.ghost_text, tokenizer_fp=tokenizer_identity(), host=host)
        notes.append("split path: the guide was saved as a prefix pack and restored from it (zero forward passes)")
    elif not isinstance(pack, packs.Pack):
        pack = packs.load_pack(pack, model, tokenizer=tokenizer, host=host)
    if list(pack.guide_ids) != list(chosen.ghost):
        raise KVBridgeError(
            f"the pack's guide ({pack.num_tokens} tokens) is not the ghost of the {split} split "
            f"({len(chosen.ghost)} tokens)",
            "save the pack from the same guide text, or check `kvbridge split`",
        )
    if split == "naive" and not chosen.matches_joint:
        notes.append(
            f"naive split: split/concat see {len(chosen.ids)} tokens, full/cached the joint {len(report.joint)}"
            " tokens; cached-vs-concat is the token-sequence (tokenizer) effect, concat-vs-split the "
            "cache-execution effect"
        )
    runner = PathRunner(model, report.joint, chosen.ghost, chosen.live, pack, host=host)
    pairs = list(combinations(paths, 2))
    per_pair: dict = {f"{a}-vs-{b}": {"seeds": []} for a, b in pairs}
    tokens: dict = {}
    from kvbridge.faults import fault_point

    units = len(seed_list) + 1  # every seed, then the greedy run
    per_unit = len(paths) * max_new_tokens
    for i, seed in enumerate(seed_list):
        gens = {path: torch.Generator().manual_seed(int(seed)) for path in paths}  # one per path, the same seed
        trajs = {path: runner.run(path, lambda lg, g=gens[path]: sampler.draw(lg, g), max_new_tokens) for path in paths}
        tokens[seed] = {p: t.tokens for p, t in trajs.items()}
        for a, b in pairs:
            per_pair[f"{a}-vs-{b}"]["seeds"].append({**compare_trajectories(trajs[a], trajs[b], sampler), "seed": seed})
        if on_seed is not None:
            on_seed(seed, {name: data["seeds"][-1] for name, data in per_pair.items()})
        if progress is not None:
            progress(i + 1, units, per_unit)
        fault_point("diverge.seed")
    for name in per_pair:
        per_pair[name]["summary"] = summarise(per_pair[name]["seeds"]) if seed_list else {}
    greedy_trajs = {p: runner.run(p, lambda lg: int(lg.argmax()), max_new_tokens) for p in paths}
    tokens["greedy"] = {p: t.tokens for p, t in greedy_trajs.items()}
    greedy = {f"{a}-vs-{b}": compare_trajectories(greedy_trajs[a], greedy_trajs[b], sampler) for a, b in pairs}
    if on_seed is not None:
        on_seed("greedy", greedy)
    if progress is not None:
        progress(units, units, per_unit)
    if 0 < len(seed_list) < MIN_SEEDS_FOR_RATE:
        notes.append(
            f"{len(seed_list)} seeds are too few to estimate how often paths diverge; "
            f"use --seeds {MIN_SEEDS_FOR_RATE} or more for a rate"
        )
    split_info = {
        "kind": chosen.kind,
        "matches_joint": chosen.matches_joint,
        "joint_len": len(report.joint),
        "ghost_len": len(chosen.ghost),
        "live_len": len(chosen.live),
        "naive_matches_joint": report.naive.matches_joint,
        "naive_len": len(report.naive.ids),
        "boundary": chosen.boundary,
        "ghost_text": chosen.ghost_text,
        "live_text": chosen.live_text,
    }
    return DivergeReport(
        paths=tuple(paths),
        sampler=sampler,
        seeds=seed_list,
        max_new_tokens=max_new_tokens,
        split=split_info,
        pairs=per_pair if seed_list else {},
        greedy=greedy,
        tokens=tokens,
        notes=notes,
    )
