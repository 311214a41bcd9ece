"""Tables and the PNG plot of recompute curves and graft results (``kvbridge eval --recompute-*``, ``graft``)."""

from __future__ import annotations

import json
from pathlib import Path

from kvbridge.evaluate.report import fmt, fmt_ci, md_table, pyplot, save_figure, text_table

COLS = (
    "condition",
    "share",
    "gap_recovered [95% CI]",
    "deficit_closed [95% CI]",
    "kl_p95",
    "top1",
    "attn cos mean",
    "attn cos min",
    "FLOPs / prefill",
    "time / prefill",
)


def rows(result: dict) -> list[list[str]]:
    out = []
    for cond, r in result["conditions"].items():
        share = r.get("share", r.get("tokens_recomputed_share"))
        layers = f" {r['layers']}" if r.get("layers") is not None and len(r["layers"]) <= 8 else ""
        out.append(
            [
                cond + layers,
                fmt(share, "{:.0%}") if share is not None else "",
                f"{fmt(r.get('gap_recovered'), '{:+.3f}')} {fmt_ci(r.get('gap_recovered_ci'), '{:+.3f}')}",
                f"{fmt(r.get('deficit_closed'), '{:+.3f}')} {fmt_ci(r.get('deficit_closed_ci'), '{:+.2f}')}",
                fmt(r.get("kl_p95"), "{:.4f}"),
                fmt(r.get("top1_agreement"), "{:.3f}"),
                fmt(r.get("attention_cosine_mean"), "{:.4f}"),
                fmt(r.get("attention_cosine_min"), "{:.4f}"),
                fmt(r.get("recompute_flop_share"), "{:.3f}"),
                fmt(r.get("time_share"), "{:.3f}"),
            ]
        )
    return out


def table(result: dict) -> str:
    return "\n".join(text_table(COLS, rows(result)))


def markdown(result: dict, title: str, image: str | None = None) -> str:
    out = [f"# {title}", ""] + md_table(COLS, rows(result))
    if image:
        out += ["", f"![curve]({image})"]
    out += ["", "Notes:"] + [f"- {n}" for n in result.get("notes") or []]
    return "\n".join(out) + "\n"


def plot(result: dict, path, title: str) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    families: dict = {}
    zero = [r for c, r in result["conditions"].items() if c in ("transferred", "naive")]
    for cond, r in result["conditions"].items():
        share = r.get("share", r.get("tokens_recomputed_share"))
        if share is None or "@" not in cond:
            continue
        families.setdefault(cond.split("@")[0], []).append((share, r))
    for fam, pts in families.items():
        if fam != "random":
            pts.extend((0.0, r) for r in zero)
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.6))
    for fam, pts in families.items():
        pts = sorted({round(s, 6): (s, r) for s, r in pts}.values(), key=lambda x: x[0])
        xs = [s for s, _ in pts]
        for ax, key in zip(axes[:3], ("gap_recovered", "kl_p95", "attention_cosine_mean")):
            ys = [r.get(key) for _, r in pts]
            ax.plot(xs, [y if y is not None else float("nan") for y in ys], marker="o", label=fam)
            cis = [r.get(key + "_ci") for _, r in pts]
            if all(ci and ci[0] is not None for ci in cis):
                ax.fill_between(xs, [ci[0] for ci in cis], [ci[1] for ci in cis], alpha=0.15)
        for key, mark, style, what in (("time_share", "o", "-", "time"), ("recompute_flop_share", "x", "--", "FLOPs")):
            ys = [r.get(key) or float("nan") for _, r in pts]
            axes[3].plot(xs, ys, marker=mark, linestyle=style, label=f"{fam} {what}")
    for ax, lab in zip(
        axes, ("gap recovered (95% CI)", "KL p95 (nats)", "attention cosine (mean over layers)", "cost / full prefill")
    ):
        ax.set_xlabel("share recomputed")
        ax.set_ylabel(lab)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].axhline(1.0, color="k", linestyle="--", linewidth=0.7)
    fig.suptitle(title)
    return save_figure(plt, fig, path, dpi=100)


def write(result: dict, folder, stem: str, title: str) -> dict:
    """``{stem}.json``, ``{stem}.md`` and ``{stem}.png`` in ``folder`` (each written atomically)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    png, tmp = folder / f"{stem}.png", folder / f".{stem}.tmp.png"
    written = {"png": tmp.replace(png)} if plot(result, tmp, title) else {}
    return {**written, **write_files(folder, stem, result, markdown(result, title, png.name if written else None))}


def write_files(folder, stem: str, result: dict, md: str) -> dict:
    """``{stem}.json`` (``result``) and ``{stem}.md`` (``md``) in ``folder`` (each written atomically)."""
    from kvbridge.artifacts import write_file_atomic

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "json": write_file_atomic(folder / f"{stem}.json", json.dumps(result, indent=2, allow_nan=False) + "\n"),
        "md": write_file_atomic(folder / f"{stem}.md", md),
    }
