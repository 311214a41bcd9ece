"""The real family pair in the demo (``kvbridge demo --sections pair``, opt-in: it takes minutes).

Qwen2.5-Coder 0.5B -> 1.5B (``kvbridge models fetch pair``), loaded once: the config-level check,
identity transfer bitwise on each model, a short ridge fit on Python source (a few packages of the
running interpreter's standard library, split by file), and the target continuing from the
transferred cache on held-out files, with the 0.5B alone beside it (the line the transfer has to
beat; RESULTS.md has the full protocol). Quality is reported, never gated: the section fails only
if an exact path is not exact or something cannot run.
"""

from __future__ import annotations

import shutil
import sysconfig
import tempfile
import time
from pathlib import Path

import click

SOURCE = "qwen2.5-coder-0.5b"
TARGET = "qwen2.5-coder-1.5b"
#: standard-library packages copied into the demo's corpus folder (plain Python, every CPython has them)
STDLIB_PACKAGES = ("json", "email", "http", "logging", "asyncio", "concurrent", "importlib", "xml")
PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


def stdlib_corpus(dest: Path, packages=STDLIB_PACKAGES) -> Path:
    """A folder corpus of ``packages`` from this interpreter's standard library (``.py`` files only)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for name in packages:
        for f in sorted((root / name).rglob("*.py")):
            if "test" in f.relative_to(root).parts or "tests" in f.relative_to(root).parts:
                continue
            target = dest / f.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, target)
    return dest


def require_fetched(source: str = SOURCE, target: str = TARGET) -> None:
    """Resolve both models (torch-free) or fail with a one-line error that says how to fetch them."""
    from kvbridge.errors import ConfigError, KVBridgeError
    from kvbridge.models import resolve

    for ref in (source, target):
        try:
            resolve(ref)
        except KVBridgeError as exc:
            raise ConfigError(
                f"the pair section needs {ref!r}, which is not here ({exc.what})",
                "run `kvbridge models fetch pair` (1.6 GB, once), then `kvbridge demo --sections pair`",
            ) from None


def pair_section(
    *,
    source: str = SOURCE,
    target: str = TARGET,
    tokens: int = 2048,
    samples: int = 8,
    prefix_len: int = 64,
    continuation_len: int = 8,
    top_k: int = 2,
    dtype: str = "float32",
    report_dir: str | None = None,
) -> bool:
    """Run the short pair protocol; True unless an exact path fails or a step cannot run."""
    import torch

    from kvbridge.demo.real import identity_check
    from kvbridge.evaluate.run import evaluate_pair
    from kvbridge.evaluate.settings import EvalSettings
    from kvbridge.models.compat import check_models
    from kvbridge.models.pair import load_pair

    require_fetched(source, target)
    t0 = time.perf_counter()
    click.echo(f"\n== Real family pair: {source} -> {target} ({dtype}) ==")
    check = check_models(source, target)
    click.echo(
        f"  check (configs only): {check.verdict}" + (f"; {'; '.join(check.reasons[:2])}" if check.reasons else "")
    )
    click.echo("  loading both models (GGUF dequantized; a few minutes on 2 cores) ...")
    pair = load_pair(source, target, dtype=dtype)
    click.echo(f"  loaded in {time.perf_counter() - t0:.0f} s")
    ok = True
    for lm in (pair.source, pair.target):
        res = identity_check(lm.model, lm.tokenizer(PROMPT, return_tensors="pt").input_ids, new_tokens=4)
        ok &= res.exact
        click.echo(
            f"  identity transfer on {lm.name}: {'bitwise' if res.exact else 'NOT EXACT'} "
            f"({res.prompt_tokens} tokens; state {'equal' if res.state_equal else 'differs'}, "
            f"max|dlogit| {res.max_logit_diff:.2e})"
        )
    with tempfile.TemporaryDirectory(prefix="kvbridge-demo-pair-") as tmp:
        corpus = stdlib_corpus(Path(tmp) / "corpus")
        out = Path(report_dir or tmp) / "pair-mapping"
        t1 = time.perf_counter()
        click.echo(
            f"  fit: ridge, top-k {top_k}, {tokens} calibration tokens of Python source ({corpus.name}: "
            f"{', '.join(STDLIB_PACKAGES)} from the standard library, split by file) ..."
        )
        mapping = short_fit(pair, corpus=str(corpus), out=str(out), tokens=tokens, top_k=top_k)
        r2 = (getattr(mapping.report, "r2_summary", None) or {}).get("mean")
        click.echo(
            f"  fitted in {time.perf_counter() - t1:.0f} s" + (f"; held-out R² {r2:.3f}" if r2 is not None else "")
        )
        t2 = time.perf_counter()
        settings = EvalSettings(
            mapping=str(out),
            corpus=str(corpus),
            samples=samples,
            prefix_len=prefix_len,
            continuation_len=continuation_len,
            greedy_tokens=continuation_len,
            conditions="native,source,transferred,no_prefix",
            bootstrap=200,
            attention=False,
            report_dir=None,
        )
        with torch.no_grad():
            run = evaluate_pair(pair, settings)
    click.echo(
        f"  eval on {samples} held-out samples (prefix {prefix_len}, continuation {continuation_len}), "
        f"{time.perf_counter() - t2:.0f} s:"
    )
    conds = run.result["conditions"]
    click.echo("    condition          NLL    gap recovered")
    for name in ("native", "source", "transferred", "no_prefix"):
        row = conds.get(name) or {}
        gap = row.get("gap_recovered")
        label = {"source": "source model alone"}.get(name, name)
        click.echo(f"    {label:<18} {row.get('nll', float('nan')):6.3f}  " + ("n/a" if gap is None else f"{gap:.3f}"))
    transferred, alone = ((conds.get(c) or {}).get("gap_recovered") for c in ("transferred", "source"))
    if transferred is not None and alone is not None:
        verdict = "beats" if transferred > alone else "does not beat"
        click.echo(
            f"  the transferred cache {verdict} the source model alone here ({transferred:.3f} vs {alone:.3f}; "
            "a short fit: RESULTS.md has the full protocol and what recompute buys back)"
        )
    click.echo(f"\npair section: {'exact paths exact' if ok else 'FAILED'} ({time.perf_counter() - t0:.1f} s)")
    return ok


def short_fit(pair, *, corpus: str, out: str, tokens: int, top_k: int):
    """The demo's fit, as ``kvbridge fit`` runs it (:func:`kvbridge.fit.run.fit_run`): ridge on ``corpus``
    (a folder of .py files, split by file, the split recorded), every position of 256-token sequences
    (stride 1: the observations a short fit needs)."""
    from kvbridge.fit.run import fit_run
    from kvbridge.fit.settings import FitSettings
    from kvbridge.run import Run

    settings = FitSettings(
        corpus=corpus, out=out, tokens=tokens, top_k=top_k, seq_len=256, stride=1, overwrite=True, quiet=True
    )
    return fit_run(Run.of(pair, settings), distributed=None)
