"""``kvbridge demo``: the best end-to-end run the project can do (the pipeline: :mod:`kvbridge.demo`)."""

from __future__ import annotations

import os
import time

import click

from kvbridge.cli.numbers import SEED, THREADS, count
from kvbridge.demo import DEFAULT_SECTIONS, SECTIONS

PAIRS = ("tuned", "wide", "odd", "stranger")


@click.command("demo")
@click.option(
    "--sections",
    default=",".join(DEFAULT_SECTIONS),
    show_default=True,
    help="Sections to run, in order: identity, zoo, real (the default, within 3 minutes on 2 cores); "
    "adapter (opt-in: the real SmolLM2 LoRA pair, fit and eval), pair (opt-in: the Qwen2.5-Coder pair).",
)
@click.option(
    "--identity",
    "identity_only",
    is_flag=True,
    help="Only section 1: the identity-transfer exactness table of every built-in family.",
)
@click.option("--skip-identity", is_flag=True, help="Leave out section 1.")
@click.option("--skip-real", is_flag=True, help="Leave out section 3 (the real model).")
@click.option("--families", default="", help="Comma-separated family adapters for section 1 (default: all built-in).")
@click.option(
    "--new-tokens",
    type=count(1),
    default=8,
    show_default=True,
    help="Greedy tokens generated per model (sections 1, 3).",
)
@click.option("--pairs", default=",".join(PAIRS), show_default=True, help="Zoo targets paired with base.")
@click.option(
    "--corpus",
    default=None,
    help="Corpus text (default: ../shared/corpora/tinyshakespeare.txt if present, "
    "else text sampled from the zoo models).",
)
@click.option("--report", "report_dir", default="demo-report", show_default=True, help="Report folder ('' for none).")
@click.option("--tokens", type=count(1), default=32768, show_default=True, help="Calibration tokens per fit.")
@click.option("--top-k", type=count(1), default=4, show_default=True, help="Ridge: source layers per target layer.")
@click.option("--stride", type=count(1), default=4, show_default=True, help="Calibration position stride.")
@click.option("--samples", type=count(2), default=64, show_default=True, help="Held-out evaluation samples per pair.")
@click.option("--prefix-len", type=count(1), default=64, show_default=True)
@click.option("--continuation-len", type=count(1), default=8, show_default=True)
@click.option("--greedy-tokens", type=count(1), default=16, show_default=True)
@click.option("--bootstrap", type=count(0), default=1000, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option(
    "--no-identity-rows", is_flag=True, help="Section 2: skip the unfitted identity transfer of same-geometry pairs."
)
@click.option(
    "--real-model",
    default="smollm2",
    show_default=True,
    help="Section 3: the real model reference (fetch smollm2 with `kvbridge models fetch`).",
)
@click.option(
    "--threads",
    type=THREADS,
    default=1,
    show_default=True,
    help="torch threads for the default sections (small models: 1 is nearly as fast on idle cores, and "
    "immune to a busy machine, where a second thread waits for the first); adapter and pair use torch's default.",
)
def demo(
    sections,
    identity_only,
    skip_identity,
    skip_real,
    families,
    new_tokens,
    pairs,
    corpus,
    report_dir,
    tokens,
    top_k,
    stride,
    samples,
    prefix_len,
    continuation_len,
    greedy_tokens,
    bootstrap,
    seed,
    no_identity_rows,
    real_model,
    threads,
) -> None:
    """Identity exactness on every family, check -> fit -> eval on the zoo, then a real model.

    Section 1 (identity): every built-in family on a tiny model built from its config: extract
    the prefix cache, transfer it (identity: bit for bit), inject, continue with generate;
    compare with transformers' own cached continuation, and re-position the prefix by +37.

    Section 2 (zoo): the trained zoo (base, tuned, wide, odd, stranger): for base->X, the
    compatibility check, a ridge fit on calibration text, and `kvbridge eval` (native,
    transferred, no_prefix, zeroed, shuffled, random, no_rope_reapply, source) on held-out
    text, in one comparison table; where the check allows reusing the cache as is (same
    geometry: tuned, stranger) the unfitted identity transfer is measured too. Per-pair
    reports and the fitted mappings go to --report.
    Text comes from ../shared/corpora/tinyshakespeare.txt (or --corpus): calibration from its
    front, evaluation from its held-out last 10%. Without it, text is sampled from the zoo
    models themselves with fixed seeds (calibration: all of them; evaluation: each pair's
    target), and the output says so.

    Section 3 (real): SmolLM2-135M-Instruct (--real-model): identity transfer in float32 and
    bfloat16 (bitwise: the same state, greedy tokens and logits as the model's own cached
    continuation; its own cached-vs-recompute noise shown for scale), the exact-token split of
    its chat template (system turn hidden), and the system turn saved as a prefix pack,
    restored with zero forward passes and continued bitwise. No network (`make demo` fetches the
    model once beforehand).

    The default (identity, zoo, real) ends within 3 minutes on 2 CPU cores; each section's wall
    and CPU time is printed as it ends, and the total with the machine's load average.

    Section 4 (adapter, opt-in: `--sections adapter`): the real adapter pair, SmolLM2 -> SmolLM2
    + the shipped Shakespeare LoRA: check, a ridge fit and eval, plain reuse against the fitted
    mapping (RESULTS.md; a few minutes on 2 CPU cores).

    Section 5 (pair, opt-in: `--sections pair`): the real family pair Qwen2.5-Coder 0.5B -> 1.5B
    (`kvbridge models fetch pair` first): the check, identity bitwise on each model, a short
    ridge fit on standard-library Python source and the transfer against the 0.5B alone on
    held-out files (6 minutes and 11.6 GB on 2 cores; RESULTS.md has the full protocol).
    """
    import torch

    from kvbridge.demo import run_section
    from kvbridge.errors import ConfigError

    wanted = [s.strip() for s in sections.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        raise ConfigError(f"unknown demo section {unknown[0]!r}", f"use some of: {', '.join(SECTIONS)}")
    if identity_only:
        wanted = ["identity"]
    wanted = [s for s in wanted if not (s == "identity" and skip_identity) and not (s == "real" and skip_real)]
    if "real" in wanted or "adapter" in wanted:
        from kvbridge.models import resolve

        resolve(real_model)  # a model that is not fetched fails before minutes of other sections
    if "pair" in wanted:
        from kvbridge.demo.pair import require_fetched

        require_fetched()
    default_threads = torch.get_num_threads()
    t0 = time.perf_counter()
    ok = True
    times: dict[str, tuple] = {}  # section -> (wall s, process cpu s)
    for name in wanted:
        torch.set_num_threads(int(threads) if threads and name not in ("adapter", "pair") else default_threads)
        t_section, c_section = time.perf_counter(), time.process_time()
        if name == "identity":
            ok &= run_section("identity", families=families, new_tokens=new_tokens)
        elif name == "zoo":
            run_section(
                "zoo",
                pairs=tuple(p.strip() for p in pairs.split(",") if p.strip()),
                corpus=corpus,
                report_dir=report_dir or None,
                tokens=tokens,
                top_k=top_k,
                stride=stride,
                samples=samples,
                prefix_len=prefix_len,
                continuation_len=continuation_len,
                greedy_tokens=greedy_tokens,
                bootstrap=bootstrap,
                seed=seed,
                identity_too=not no_identity_rows,
            )
        elif name == "real":
            ok &= run_section("real", ref=real_model, new_tokens=new_tokens, report_dir=report_dir or None).ok
        elif name == "adapter":
            ok &= run_section("adapter", ref=real_model, report_dir=report_dir or None)
        elif name == "pair":
            ok &= run_section("pair", report_dir=report_dir or None)
        times[name] = (time.perf_counter() - t_section, time.process_time() - c_section)
        click.echo(f"[section {name}: {times[name][0]:.1f} s, cpu {times[name][1]:.1f} s]")
    parts = ", ".join(f"{name} {wall:.1f} s (cpu {cpu:.1f} s)" for name, (wall, cpu) in times.items())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    click.echo(f"demo: {time.perf_counter() - t0:.1f} s: {parts}; load average {load:.2f} on {os.cpu_count()} cores")
    if not ok:
        raise SystemExit(1)
