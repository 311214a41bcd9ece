"""Per-position arrays of the teacher-forced conditions, and their summary.

:func:`position_fields` reduces one batch of one condition's logits (NLL, correctness, the
comparisons with the reference); :func:`stack_fields` stacks the batches and gives every condition
its references' NLL and correctness; :func:`summarize_fields` is ``kvbridge eval``'s metrics with
paired bootstrap intervals, plus ``deficit_closed``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch


def position_fields(
    logits: torch.Tensor, targets: torch.Tensor, native: dict | None, *, top_k: int, top_p: float
) -> dict:
    """Per-position arrays of one batch of one condition (``logits [B, C, V]``; float64 math).

    One log-softmax per condition; its ``exp`` gives the probabilities the nucleus truncates
    (the same for native and every condition, so native against itself is exactly 0), and the
    argmax is taken once.
    """
    from kvbridge import divergence as dv

    logp = dv.log_probs(logits)
    argmax = logp.argmax(-1)
    out = {
        "nll": -logp.gather(-1, targets[..., None]).squeeze(-1),
        "correct": (argmax == targets).float(),
    }
    if native is None:  # this is the native condition: keep what the others compare with
        probs = logp.exp()
        return out, {
            "logp": logp,
            "probs": probs,
            "logits": logits.double(),
            "argmax": argmax,
            "topk": dv.topk_indices(logp, top_k),
            "nucleus": dv.nucleus(probs, top_p),
        }
    if logp.shape[-1] != native["logp"].shape[-1]:
        nan = torch.full(targets.shape, float("nan"))
        out.update(kl=nan, top1=nan, topk=nan, tv=nan, max_abs_logit_diff=torch.full(targets.shape[:1], float("nan")))
        return out, None
    out["kl"] = dv.kl(None, None, logp=native["logp"], logq=logp, p=native.get("probs"))
    out["top1"] = (argmax == native["argmax"]).float()
    out["topk"] = dv.topk_overlap(native["logp"], logp, top_k, p_topk=native["topk"]).float()
    out["tv"] = dv.tv(native["nucleus"], dv.nucleus(logp.exp(), top_p))
    out["max_abs_logit_diff"] = (logits.double() - native["logits"]).abs().flatten(1).max(dim=1).values
    return out, None


def native_fields(logits: torch.Tensor, targets: torch.Tensor, *, top_k: int, top_p: float) -> tuple[dict, dict]:
    """The reference condition's per-position arrays, its comparisons with itself included (exact
    by definition: KL 0, same argmax, full top-k overlap, TV 0, no logit difference), and what the
    other conditions compare with."""
    fields, native = position_fields(logits, targets, None, top_k=top_k, top_p=top_p)
    zeros = torch.zeros(targets.shape, dtype=torch.float64)
    ones = torch.ones(targets.shape, dtype=torch.float64)
    fields.update(
        kl=zeros,
        top1=ones,
        topk=ones * (min(top_k, logits.shape[-1]) / top_k),
        tv=zeros,
        max_abs_logit_diff=torch.zeros(targets.shape[:1], dtype=torch.float64),
    )
    return fields, native


def stack_fields(acc: dict, names, *, ceiling: str, floor: str) -> dict:
    """Per-condition batches (``acc[cond][field]``: lists of tensors) stacked over samples, each
    condition given the ``ceiling`` and ``floor`` conditions' NLL and correctness as the native
    and no-prefix references the eval metrics read (the floor's only where it ran)."""
    fields = {cond: {k: torch.cat(v, 0) for k, v in acc[cond].items()} for cond in names}
    for cond in names:
        for ref, name in ((ceiling, "native"), (floor, "no_prefix")):
            if ref in fields:  # else no floor condition ran
                fields[cond].update({f"{name}_{k}": fields[ref][k] for k in ("nll", "correct")})
    return fields


def summarize_fields(
    fields: dict, *, bootstrap: int = 1000, seed: int = 0, reference: str | None = None, greedy_tokens: int = 16
) -> dict:
    """kvbridge eval's metrics (with paired bootstrap CIs) of per-condition fields, plus ``deficit_closed``.

    ``deficit_closed`` = ``(NLL_ref - NLL_x) / (NLL_ref - NLL_native)``: the share of what the
    ``reference`` condition (the naive graft, or the plain transfer) misses that x wins back.
    """
    from kvbridge.evaluate.metrics import percentile_interval, bootstrap_indices, resolve_metrics, summarize

    run = SimpleNamespace(
        config=SimpleNamespace(greedy_tokens=greedy_tokens, top_k=5, top_p=0.9),
        fields=fields,
        num_samples=int(next(iter(next(iter(fields.values())).values())).shape[0]),
    )
    metrics = [m for m in resolve_metrics() if m.name not in ("greedy_first_divergence", "greedy_agreement")]
    out = summarize(run, metrics, bootstrap=bootstrap, seed=seed)
    if reference and reference in fields:
        n = run.num_samples
        idx = bootstrap_indices(n, bootstrap, seed) if bootstrap > 0 else None
        nat = fields[reference]["native_nll"].double().flatten(1).mean(1)
        ref = fields[reference]["nll"].double().flatten(1).mean(1)
        for cond, f in fields.items():
            x = f["nll"].double().flatten(1).mean(1)
            row = out["conditions"][cond]
            row["deficit_closed"] = float(share_closed(ref, nat, x, torch.arange(n)[None])[0])
            row["deficit_closed_ci"] = (
                percentile_interval(share_closed(ref, nat, x, idx)) if idx is not None else [None, None]
            )
    return out


def share_closed(ref, best, x, sel):
    """``(ref - x) / (ref - best)`` of per-sample means over the resampled indices ``sel`` (NaN where
    ``ref`` and ``best`` tie): the gap recovered (ref the floor), the deficit closed (ref a condition)."""
    r, b, v = ref[sel].mean(-1), best[sel].mean(-1), x[sel].mean(-1)
    den = r - b
    return torch.where(den.abs() > 1e-9, (r - v) / den, torch.full_like(v, float("nan")))
