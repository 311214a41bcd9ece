"""Demo section 2: check -> fit -> eval on the embedded trained zoo (base -> tuned, wide, odd, stranger).

For base->X: the compatibility check, a ridge fit on calibration text, and the evaluation
(native, transferred, no_prefix and the controls) on held-out text, in one comparison table;
where the check allows reusing the cache as is (same geometry) the unfitted identity transfer
is measured too. Text: ../shared/corpora/tinyshakespeare.txt (or a corpus given), else text
sampled from the zoo models with fixed seeds (and the output says so).
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from kvbridge.errors import ConfigError
from kvbridge.evaluate import corpus_samples, evaluate, model_samples
from kvbridge.evaluate.report import fmt, fmt_ci, md_table, terminal_table, text_table, to_json, write_report
from kvbridge.zoo import default_corpus

SEQ_LEN = 128  # the zoo's training sequence length: calibration sequences are this long


def find_corpus(corpus: str | None) -> Path | None:
    if corpus:
        path = Path(corpus)
        if not path.is_file():
            raise ConfigError(f"corpus not found at {path}", "pass --corpus PATH to a text file")
        return path
    path = default_corpus()
    return path if path.is_file() else None


def _sampled(models: dict, n: int, length: int, seed: int):
    """``[n, length]`` ids sampled from every model of ``models`` in equal shares, fixed seeds."""
    import torch

    names = sorted(models)
    per = -(-n // len(names))
    return torch.cat([model_samples(models[k], n=per, length=length, seed=seed + i) for i, k in enumerate(names)])[:n]


def calibration_ids(corpus: Path | None, tokenizer, models: dict, tokens: int, seed: int = 1000):
    """``[n, SEQ_LEN]`` calibration ids: the corpus's front (the zoo's ``base`` split) or model samples."""
    import torch

    n = max(2, tokens // SEQ_LEN)
    if corpus is not None:
        from kvbridge.zoo import split_text

        text = split_text(corpus.read_text(encoding="utf-8"), "base")
        ids = tokenizer(text[: tokens * 8], add_special_tokens=False)["input_ids"][: n * SEQ_LEN]
        return torch.tensor(ids, dtype=torch.long).view(-1, SEQ_LEN)
    return _sampled(models, n, SEQ_LEN, seed)  # every zoo model in use writes an equal share


def eval_ids(corpus: Path | None, tokenizer, models: dict, n: int, length: int, seed: int = 2000):
    """``(samples [n, length], data info)``: the corpus's held-out tail, or model samples."""
    if corpus is not None:
        return corpus_samples(corpus, tokenizer, n=n, length=length)
    return _sampled(models, n, length, seed), {
        "kind": "model samples",
        "models": sorted(models),
        "seed": seed,
        "note": "no corpus: text sampled from the zoo models (temperature 1)",
    }


COMPARE = (
    "pair",
    "check",
    "R2",
    "nll nat",
    "nll xfer",
    "nll nopre",
    "best control",
    "gap_rec [95% CI]",
    "kl_p95",
    "top1",
    "cos_min",
    "greedy",
    "gates",
)


def comparison_rows(results: dict, checks: dict) -> list[list[str]]:
    from kvbridge.evaluate.conditions import CONTROLS

    rows = []
    for pair, res in results.items():
        c = res["conditions"]
        t = c["transferred"]
        controls = [(x, c[x]["nll"]) for x in CONTROLS if x in c and c[x]["nll"] is not None]
        name, val = min(controls, key=lambda x: x[1]) if controls else ("n/a", None)  # the best control
        r2 = (res["mapping"].get("r2_summary") or {}).get("mean")
        failed = ", ".join(g["metric"] for g in res["gates"] if not g["passed"])
        gates = "PASS" if res["gates_passed"] else f"FAIL ({failed})"
        rows.append(
            [
                pair,
                checks.get(pair, ""),
                fmt(r2, "{:.3f}"),
                fmt(c["native"]["nll"]),
                fmt(t["nll"]),
                fmt(c["no_prefix"]["nll"]),
                f"{name} {fmt(val)}",
                f"{fmt(t['gap_recovered'], '{:+.3f}')} {fmt_ci(t['gap_recovered_ci'], '{:+.2f}')}",
                fmt(t["kl_p95"], "{:.4f}"),
                fmt(t["top1_agreement"]),
                fmt(t["attention_cosine_min"]),
                fmt(t["greedy_agreement"]),
                gates,
            ]
        )
    return rows


def zoo_section(settings) -> dict:
    """Section 2 as :class:`kvbridge.demo.settings.DemoSettings` asks (its zoo fields)."""
    s = settings
    samples, prefix_len, continuation_len, seed = s.samples, s.prefix_len, s.continuation_len, s.seed
    import json

    from kvbridge.models.compat import check_models
    from kvbridge.fit import FitSettings, fit_run
    from kvbridge.run import model_run
    from kvbridge.plugins import get_host
    from kvbridge.models import load, resolve
    from kvbridge.threads import quiet_torch
    from kvbridge.transfer import IdentityMapping

    quiet_torch(None)  # transformers' logging quiet
    host = get_host()
    t_start = time.perf_counter()
    corpus_path = find_corpus(s.corpus)
    loaded = load("zoo:base", host=host)
    base, tok = loaded.model, loaded.tokenizer
    models = {"base": base, **{name: load(f"zoo:{name}", host=host, tokenizer=False).model for name in s.pairs}}
    click.echo(
        f"\n== 2. Zoo: check -> fit -> eval  (calibration: the front of {corpus_path} (the zoo's base "
        f"split); evaluation: its held-out last 10%)"
        if corpus_path is not None
        else "\n== 2. Zoo: check -> fit -> eval  (no corpus found: calibration and evaluation text are "
        "SAMPLED FROM THE ZOO MODELS with fixed seeds (calibration: all of them; evaluation: each pair's "
        "target); pass --corpus PATH for real text)"
    )
    calib = calibration_ids(corpus_path, tok, models, s.tokens, seed=1000 + seed)
    length = prefix_len + continuation_len + 1
    shared = eval_ids(corpus_path, tok, models, samples, length, seed=2000 + seed) if corpus_path else None
    report_dir = Path(s.report_dir) if s.report_dir else None
    results, checks, folders = {}, {}, {}
    common = dict(
        prefix_len=prefix_len,
        continuation_len=continuation_len,
        greedy_tokens=s.greedy_tokens,
        bootstrap=s.bootstrap,
        seed=seed,
        host=host,
    )

    def record(label: str, folder: str, res: dict, verdict: str, line: str) -> None:
        results[label], checks[label], folders[label] = res, verdict, folder
        click.echo(f"  {line}; gates {'PASS' if res['gates_passed'] else 'FAIL'}", err=True)
        if report_dir:
            write_report(res, report_dir / folder)

    for name in s.pairs:
        pair = f"base->{name}"
        t0 = time.perf_counter()
        report = check_models(resolve("zoo:base", host=host), resolve(f"zoo:{name}", host=host), host=host)
        out = report_dir / "mappings" / f"base-{name}" if report_dir else None
        # without a corpus each pair is evaluated on text sampled from its *target*: text from the
        # source would favour the source's own (mapped) cache over the target's native one
        ids, data = shared or eval_ids(None, tok, {name: models[name]}, samples, length, seed=2000 + seed)
        fit_settings = FitSettings(top_k=s.top_k, stride=s.stride, seed=seed, out=out, overwrite=True)
        run = model_run(base, models[name], fit_settings, host, names=("zoo:base", f"zoo:{name}"))
        mapping = fit_run(run, data=calib, distributed=None)
        t1 = time.perf_counter()
        labels = {"source_name": "zoo:base", "target_name": f"zoo:{name}", "data": data}
        res = evaluate(
            base, models[name], mapping, ids, **common, **labels, mapping_path=None if out is None else str(out)
        )
        t2 = time.perf_counter()
        res["demo"] = {
            "check": report.verdict,
            "fit_seconds": t1 - t0,
            "eval_seconds": t2 - t1,
            "calibration_sequences": int(calib.shape[0]),
            "calibration_tokens": int(calib.numel()),
            "top_k": s.top_k,
            "stride": s.stride,
        }
        r2 = (mapping.report.r2_summary or {}).get("mean", float("nan"))
        line = f"{pair}: check {report.verdict}; fit {t1 - t0:.1f} s (held-out R² {r2:.3f}); eval {t2 - t1:.1f} s"
        record(pair, f"base-{name}", res, report.verdict, line)
        same_geometry = all(a.verdict == "same" for a in report.axes if a.name in ("layers", "kv_heads", "head_dim"))
        if s.identity_too and report.verdict != "incompatible" and same_geometry:
            # the check allows reusing the cache as is (same geometry): measure that too, unfitted
            t3 = time.perf_counter()
            ires = evaluate(base, models[name], IdentityMapping(), ids, **common, **labels)
            secs = time.perf_counter() - t3
            ires["demo"] = {
                "check": report.verdict,
                "fit_seconds": 0.0,
                "eval_seconds": secs,
                "mapping": "identity (no fit)",
            }
            line = f"{pair} with the identity mapping (no fit): eval {secs:.1f} s"
            record(f"{pair} (identity, no fit)", f"base-{name}-identity", ires, report.verdict, line)
    rows = comparison_rows(results, checks)
    click.echo(
        f"\n{samples} held-out samples per pair: prefix {prefix_len} tokens cached, continuation "
        f"{continuation_len} scored; calibration {int(calib.numel())} tokens, ridge top-k {s.top_k}, stride "
        f"{s.stride}; gates: kl_p95<=0.2, attention_cosine_min>=0.9; {s.bootstrap} paired bootstrap resamples\n"
    )
    click.echo("\n".join(text_table(COMPARE, rows, right=False)))
    click.echo(
        "\n(gap_rec: (NLL_no_prefix - NLL_x)/(NLL_no_prefix - NLL_native); best control: the lowest NLL of "
        "zeroed, shuffled, random, no_rope_reapply; '(identity, no fit)': the source cache reused as is, "
        "RoPE re-applied, where the check allows it by geometry)"
    )
    if "base->tuned" in results:
        click.echo("\n-- base->tuned in full --\n")
        click.echo(terminal_table(results["base->tuned"]))
    elapsed = time.perf_counter() - t_start
    if report_dir:
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "demo.json").write_text(to_json({"pairs": results, "seconds": elapsed}) + "\n", encoding="utf-8")
        data = next(iter(results.values()))["data"] if results else {}
        md = [
            "# kvbridge demo: the embedded zoo",
            "",
            f"Data: {json.dumps(data)}" + ("" if shared else " (per pair: sampled from its target)"),
            "",
            f"{samples} held-out samples per pair; prefix {prefix_len}, continuation {continuation_len}; calibration "
            f"{int(calib.numel())} tokens; ridge top-k {s.top_k}, stride {s.stride}.",
            "",
            *md_table(COMPARE, rows),
            "",
            "Per pair: " + ", ".join(f"[{p}]({folders[p]}/summary.md)" for p in results),
            "",
        ]
        (report_dir / "summary.md").write_text("\n".join(md), encoding="utf-8")
        click.echo(f"\nreport: {report_dir}/summary.md (+ per pair: summary.md, eval.json, PNG plots; mappings/)")
    click.echo(f"zoo section: {elapsed:.1f} s")
    return results
