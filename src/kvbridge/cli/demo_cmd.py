"""``kvbridge demo``: the best end-to-end run the project can do (the pipeline: :mod:`kvbridge.demo`)."""

from __future__ import annotations

import os
import time

import click

from kvbridge.cli.options import settings_from, settings_options
from kvbridge.demo import SECTIONS, run_section
from kvbridge.demo.settings import DemoSettings


@click.command("demo")
@settings_options(DemoSettings)
def demo(**options) -> None:
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

    from kvbridge.errors import ConfigError, names_value

    s = settings_from(DemoSettings, options)
    wanted = list(names_value(s.sections, "--sections"))
    unknown = [name for name in wanted if name not in SECTIONS]
    if unknown:
        raise ConfigError(f"unknown demo section {unknown[0]!r}", f"use some of: {', '.join(SECTIONS)}")
    if s.identity_only:
        wanted = ["identity"]
    wanted = [n for n in wanted if not (n == "identity" and s.skip_identity) and not (n == "real" and s.skip_real)]
    if "real" in wanted or "adapter" in wanted:
        from kvbridge.models import resolve

        resolve(s.real_model)  # a model that is not fetched fails before minutes of other sections
    if "pair" in wanted:
        from kvbridge.demo.pair import require_fetched

        require_fetched()
    default_threads = torch.get_num_threads()
    t0 = time.perf_counter()
    ok = True
    times: dict[str, tuple] = {}  # section -> (wall s, process cpu s)
    report_dir = s.report_dir or None
    for name in wanted:
        torch.set_num_threads(int(s.threads) if s.threads and name not in ("adapter", "pair") else default_threads)
        t_section, c_section = time.perf_counter(), time.process_time()
        if name == "identity":
            ok &= run_section("identity", families=s.families, new_tokens=s.new_tokens)
        elif name == "zoo":
            run_section("zoo", settings=s)
        elif name == "real":
            ok &= run_section("real", ref=s.real_model, new_tokens=s.new_tokens, report_dir=report_dir).ok
        elif name == "adapter":
            ok &= run_section("adapter", ref=s.real_model, report_dir=report_dir)
        elif name == "pair":
            ok &= run_section("pair", report_dir=report_dir)
        times[name] = (time.perf_counter() - t_section, time.process_time() - c_section)
        click.echo(f"[section {name}: {times[name][0]:.1f} s, cpu {times[name][1]:.1f} s]")
    parts = ", ".join(f"{name} {wall:.1f} s (cpu {cpu:.1f} s)" for name, (wall, cpu) in times.items())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    click.echo(f"demo: {time.perf_counter() - t0:.1f} s: {parts}; load average {load:.2f} on {os.cpu_count()} cores")
    if not ok:
        raise SystemExit(1)
