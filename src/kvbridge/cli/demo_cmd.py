"""``kvbridge demo``: the best end-to-end run the project can do, on embedded tiny models.

Two sections:

1. **identity** (the foundation's exactness demo): every built-in family on a tiny model built
   from its config, identity-transferred (strip RoPE, copy, re-apply) and compared with
   transformers' own cached continuation;
2. **zoo**: check -> fit -> eval on the embedded trained zoo for base->tuned, base->wide,
   base->odd and base->stranger, one comparison table, and a report folder.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

PAIRS = ("tuned", "wide", "odd", "stranger")
SEQ_LEN = 128  # the zoo's training sequence length: calibration sequences are this long


def identity_section(families: str, new_tokens: int) -> bool:
    """The identity-transfer table over every built-in family; True when all are exact."""
    from transformers.utils import logging as hf_logging

    from kvbridge.plugins import get_host
    from kvbridge.testing.contract import (
        IdentityResult,
        NotApplicable,
        adapter_configs,
        check_identity_transfer,
        check_shifted_identity,
    )

    hf_logging.set_verbosity_error()
    host = get_host()
    wanted = {f.strip() for f in families.split(",") if f.strip()}
    rows = []
    for adapter in host.adapters():
        if wanted and adapter.name not in wanted:
            continue
        for variant, cfg in adapter_configs(adapter).items():
            t0 = time.perf_counter()
            spec = adapter.describe(cfg)
            try:
                res = check_identity_transfer(adapter, cfg, host=host, new_tokens=new_tokens)
                try:
                    shift = check_shifted_identity(adapter, cfg, host=host)
                except NotApplicable:
                    shift = None
            except AssertionError as exc:  # report, keep going, fail at the end
                click.echo(f"  {adapter.name}/{variant}: FAILED: {exc}", err=True)
                res, shift = IdentityResult(float("inf"), float("inf"), False, new_tokens), None
            rows.append((adapter.name, variant, spec, res, shift, time.perf_counter() - t0))
            click.echo(f"  {adapter.name}/{variant}: tokens {'==' if res.tokens_equal else '!='}, "
                       f"max|dlogit| {res.max_logit_diff:.1e}", err=True)
    click.echo("\n== 1. Identity transfer vs transformers' own cached continuation (float32, greedy)\n")
    head = f"{'family':<12} {'variant':<14} {'layers':>6} {'kv':>3} {'dim':>4} {'pos':<9} {'attn':<8} " \
           f"{'tokens':<7} {'max|dlogit|':>11} {'shifted':>9} {'s':>5}"
    click.echo(head)
    click.echo("-" * len(head))
    for name, variant, spec, res, shift, secs in rows:
        shifted = f"{shift:.1e}" if shift is not None else "n/a"
        click.echo(f"{name:<12} {variant:<14} {spec.num_layers:>6} {spec.num_kv_heads:>3} {spec.head_dim:>4} "
                   f"{spec.positional:<9} {spec.attention_kind:<8} {'same' if res.tokens_equal else 'DIFF':<7} "
                   f"{res.max_logit_diff:>11.1e} {shifted:>9} {secs:>5.1f}")
    ok = all(r[3].tokens_equal and r[3].max_logit_diff <= 1e-6 for r in rows)
    click.echo(f"\n{len(rows)} model variants; identity transfer exact (tokens equal, max|dlogit| <= 1e-6): "
               f"{'yes' if ok else 'NO'}")
    return ok


# -- the zoo section ------------------------------------------------------------------------------
def find_corpus(corpus: str | None) -> Path | None:
    if corpus:
        path = Path(corpus)
        if not path.is_file():
            from kvbridge.errors import ConfigError

            raise ConfigError(f"corpus not found at {path}", "pass --corpus PATH to a text file")
        return path
    from kvbridge.zoo.build import default_corpus

    path = default_corpus()
    return path if path.is_file() else None


def calibration_ids(corpus: Path | None, tokenizer, models: dict, tokens: int, seed: int = 1000):
    """``[n, SEQ_LEN]`` calibration ids: the corpus's front (the zoo's ``base`` split) or model samples."""
    import torch

    from kvbridge.evaluate import model_samples

    n = max(2, tokens // SEQ_LEN)
    if corpus is not None:
        from kvbridge.zoo.train import split_text

        text = split_text(corpus.read_text(encoding="utf-8"), "base")
        ids = tokenizer(text[: tokens * 8], add_special_tokens=False)["input_ids"][: n * SEQ_LEN]
        return torch.tensor(ids, dtype=torch.long).view(-1, SEQ_LEN)
    names = sorted(models)  # every zoo model in use writes an equal share, fixed seeds
    per = -(-n // len(names))
    parts = [model_samples(models[name], n=per, length=SEQ_LEN, seed=seed + i) for i, name in enumerate(names)]
    return torch.cat(parts)[:n]


def eval_ids(corpus: Path | None, tokenizer, models: dict, n: int, length: int, seed: int = 2000):
    """``(samples [n, length], data info)``: the corpus's held-out tail, or model samples."""
    import torch

    from kvbridge.evaluate import corpus_samples, model_samples

    if corpus is not None:
        return corpus_samples(corpus, tokenizer, n=n, length=length)
    names = sorted(models)
    per = -(-n // len(names))
    parts = [model_samples(models[name], n=per, length=length, seed=seed + i) for i, name in enumerate(names)]
    return torch.cat(parts)[:n], {"kind": "model samples", "models": names, "seed": seed,
                                  "note": "no corpus: text sampled from the zoo models (temperature 1)"}


def _best_control(res: dict) -> tuple[str, float | None]:
    from kvbridge.evaluate.conditions import CONTROLS

    rows = [(c, res["conditions"][c]["nll"]) for c in CONTROLS if c in res["conditions"]]
    rows = [(c, v) for c, v in rows if v is not None]
    return min(rows, key=lambda x: x[1]) if rows else ("n/a", None)


COMPARE = ("pair", "check", "R2", "nll nat", "nll xfer", "nll nopre", "best control", "gap_rec [95% CI]",
           "kl_p95", "top1", "cos_min", "greedy", "gates")


def _folder(pair: str) -> str:
    name = pair.split("->")[1]
    return f"base-{name.split(' ')[0]}-identity" if "identity" in name else f"base-{name}"


def comparison_rows(results: dict, checks: dict) -> list[list[str]]:
    from kvbridge.evaluate.report import fmt, fmt_ci

    rows = []
    for pair, res in results.items():
        c = res["conditions"]
        t = c["transferred"]
        name, val = _best_control(res)
        r2 = (res["mapping"].get("r2_summary") or {}).get("mean")
        gates = "PASS" if res["gates_passed"] else "FAIL (" + ", ".join(
            g["metric"] for g in res["gates"] if not g["passed"]) + ")"
        rows.append([pair, checks.get(pair, ""), fmt(r2, "{:.3f}"), fmt(c["native"]["nll"]), fmt(t["nll"]),
                     fmt(c["no_prefix"]["nll"]), f"{name} {fmt(val)}",
                     f"{fmt(t['gap_recovered'], '{:+.3f}')} {fmt_ci(t['gap_recovered_ci'], '{:+.2f}')}",
                     fmt(t["kl_p95"], "{:.4f}"), fmt(t["top1_agreement"]), fmt(t["attention_cosine_min"]),
                     fmt(t["greedy_agreement"]), gates])
    return rows


def render_table(rows: list[list[str]], heads=COMPARE) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))
    return "\n".join([line(heads), "-" * len(line(heads))] + [line(r) for r in rows])


def markdown_table(rows: list[list[str]], heads=COMPARE) -> str:
    return "\n".join(["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def zoo_section(*, pairs, corpus, report_dir, tokens, top_k, stride, samples, prefix_len, continuation_len,
                greedy_tokens, bootstrap, seed, identity_too: bool = True) -> dict:
    import json

    from transformers.utils import logging as hf_logging

    from kvbridge.check.compat import check_models
    from kvbridge.evaluate import evaluate
    from kvbridge.evaluate.report import terminal_table, to_json, write_report
    from kvbridge.fit import fit
    from kvbridge.fit.calibrate import CalibrationConfig
    from kvbridge.fit.pipeline import Provenance
    from kvbridge.plugins import get_host
    from kvbridge.check.sources import resolve
    from kvbridge.zoo import load_zoo_model, model_dir

    hf_logging.set_verbosity_error()
    host = get_host()
    t_start = time.perf_counter()
    corpus_path = find_corpus(corpus)
    base, tok = load_zoo_model("base")
    models = {"base": base}
    for name in pairs:
        models[name] = load_zoo_model(name)[0]
    if corpus_path is not None:
        click.echo(f"\n== 2. Zoo: check -> fit -> eval  (calibration: the front of {corpus_path} (the zoo's base "
                   f"split); evaluation: its held-out last 10%)")
    else:
        click.echo("\n== 2. Zoo: check -> fit -> eval  (no corpus found: calibration and evaluation text are "
                   "SAMPLED FROM THE ZOO MODELS with fixed seeds (calibration: all of them; evaluation: each pair's "
                   "target); pass --corpus PATH for real text)")
    calib = calibration_ids(corpus_path, tok, models, tokens, seed=1000 + seed)
    length = prefix_len + continuation_len + 1
    shared = eval_ids(corpus_path, tok, models, samples, length, seed=2000 + seed) if corpus_path else None

    def eval_data(name):
        # without a corpus each pair is evaluated on text sampled from its *target*: text from the
        # source would favour the source's own (mapped) cache over the target's native one
        return shared or eval_ids(None, tok, {name: models[name]}, samples, length, seed=2000 + seed)
    report_dir = Path(report_dir) if report_dir else None
    results, checks, fits = {}, {}, {}
    for name in pairs:
        pair = f"base->{name}"
        t0 = time.perf_counter()
        report = check_models(resolve(str(model_dir("base")), host=host), resolve(str(model_dir(name)), host=host),
                              host=host)
        checks[pair] = report.verdict
        out = report_dir / "mappings" / f"base-{name}" if report_dir else None
        ids, data = eval_data(name)
        mapping = fit(base, models[name], calib, options={"top_k": top_k},
                      calibration=CalibrationConfig(stride=stride, seed=seed), host=host, distributed=None,
                      out=out, overwrite=True, provenance=Provenance("zoo:base", f"zoo:{name}"))
        t1 = time.perf_counter()
        res = evaluate(base, models[name], mapping, ids, prefix_len=prefix_len, continuation_len=continuation_len,
                       greedy_tokens=greedy_tokens, bootstrap=bootstrap, seed=seed, host=host,
                       source_name="zoo:base", target_name=f"zoo:{name}", data=data,
                       mapping_path=None if out is None else str(out))
        t2 = time.perf_counter()
        res["demo"] = {"check": report.verdict, "fit_seconds": t1 - t0, "eval_seconds": t2 - t1,
                       "calibration_sequences": int(calib.shape[0]), "calibration_tokens": int(calib.numel()),
                       "top_k": top_k, "stride": stride}
        results[pair] = res
        fits[pair] = mapping
        summ = mapping.report.r2_summary or {}
        click.echo(f"  {pair}: check {report.verdict}; fit {t1 - t0:.1f} s (held-out R² {summ.get('mean', float('nan')):.3f}); "
                   f"eval {t2 - t1:.1f} s; gates {'PASS' if res['gates_passed'] else 'FAIL'}", err=True)
        if report_dir:
            write_report(res, report_dir / f"base-{name}")
        same_geometry = all(a.verdict == "same" for a in report.axes if a.name in ("layers", "kv_heads", "head_dim"))
        if identity_too and report.verdict != "incompatible" and same_geometry:
            # the check allows reusing the cache as is (same geometry): measure that too, unfitted
            from kvbridge.builtin.identity import IdentityMapping

            t3 = time.perf_counter()
            ires = evaluate(base, models[name], IdentityMapping(), ids, prefix_len=prefix_len,
                            continuation_len=continuation_len, greedy_tokens=greedy_tokens, bootstrap=bootstrap,
                            seed=seed, host=host, source_name="zoo:base", target_name=f"zoo:{name}", data=data)
            ires["demo"] = {"check": report.verdict, "fit_seconds": 0.0, "eval_seconds": time.perf_counter() - t3,
                            "mapping": "identity (no fit)"}
            results[f"{pair} (identity, no fit)"] = ires
            checks[f"{pair} (identity, no fit)"] = report.verdict
            click.echo(f"  {pair} with the identity mapping (no fit): eval {time.perf_counter() - t3:.1f} s; gates "
                       f"{'PASS' if ires['gates_passed'] else 'FAIL'}", err=True)
            if report_dir:
                write_report(ires, report_dir / f"base-{name}-identity")
    rows = comparison_rows(results, checks)
    click.echo(f"\n{samples} held-out samples per pair: prefix {prefix_len} tokens cached, continuation "
               f"{continuation_len} scored; calibration {int(calib.numel())} tokens, ridge top-k {top_k}, stride "
               f"{stride}; gates: kl_p95<=0.2, attention_cosine_min>=0.9; {bootstrap} paired bootstrap resamples\n")
    click.echo(render_table(rows))
    click.echo("\n(gap_rec: (NLL_no_prefix - NLL_x)/(NLL_no_prefix - NLL_native); best control: the lowest NLL of "
               "zeroed, shuffled, random, no_rope_reapply; '(identity, no fit)': the source cache reused as is, "
               "RoPE re-applied, where the check allows it by geometry)")
    if "base->tuned" in results:
        click.echo("\n-- base->tuned in full --\n")
        click.echo(terminal_table(results["base->tuned"]))
    elapsed = time.perf_counter() - t_start
    if report_dir:
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "demo.json").write_text(to_json({"pairs": results, "seconds": elapsed}) + "\n", encoding="utf-8")
        data = next(iter(results.values()))["data"] if results else {}
        md = ["# kvbridge demo: the embedded zoo", "",
              f"Data: {json.dumps(data)}" + ("" if shared else " (per pair: sampled from its target)"), "",
              f"{samples} held-out samples per pair; prefix {prefix_len}, continuation {continuation_len}; calibration "
              f"{int(calib.numel())} tokens; ridge top-k {top_k}, stride {stride}.", "",
              markdown_table(rows), "",
              "Per pair: " + ", ".join(f"[{p}]({_folder(p)}/summary.md)" for p in results), ""]
        (report_dir / "summary.md").write_text("\n".join(md), encoding="utf-8")
        click.echo(f"\nreport: {report_dir}/summary.md (+ per pair: summary.md, eval.json, PNG plots; mappings/)")
    click.echo(f"zoo section: {elapsed:.1f} s")
    return results


@click.command("demo")
@click.option("--identity", "identity_only", is_flag=True,
              help="Only section 1: the identity-transfer exactness table of every built-in family.")
@click.option("--skip-identity", is_flag=True, help="Only section 2: the zoo check -> fit -> eval.")
@click.option("--families", default="", help="Comma-separated family adapters for section 1 (default: all built-in).")
@click.option("--new-tokens", default=8, show_default=True, help="Greedy tokens generated per model in section 1.")
@click.option("--pairs", default=",".join(PAIRS), show_default=True, help="Zoo targets paired with base.")
@click.option("--corpus", default=None, help="Corpus text (default: ../shared/corpora/tinyshakespeare.txt if present, "
                                             "else text sampled from the zoo models).")
@click.option("--report", "report_dir", default="demo-report", show_default=True,
              help="Report folder ('' for none).")
@click.option("--tokens", default=32768, show_default=True, help="Calibration tokens per fit.")
@click.option("--top-k", default=4, show_default=True, help="Ridge: source layers per target layer.")
@click.option("--stride", default=4, show_default=True, help="Calibration position stride.")
@click.option("--samples", default=64, show_default=True, help="Held-out evaluation samples per pair.")
@click.option("--prefix-len", default=64, show_default=True)
@click.option("--continuation-len", default=8, show_default=True)
@click.option("--greedy-tokens", default=16, show_default=True)
@click.option("--bootstrap", default=1000, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--no-identity-rows", is_flag=True,
              help="Section 2: skip the unfitted identity transfer of same-geometry pairs.")
@click.option("--threads", default=1, show_default=True,
              help="torch threads (tiny models: 1 is as fast and immune to a busy machine).")
def demo(identity_only, skip_identity, families, new_tokens, pairs, corpus, report_dir, tokens, top_k, stride, samples,
         prefix_len, continuation_len, greedy_tokens, bootstrap, seed, no_identity_rows, threads) -> None:
    """Identity exactness on every family, then check -> fit -> eval on the embedded zoo.

    Section 1: every built-in family on a tiny model built from its config: extract the
    prefix cache, strip RoPE, map (identity), re-apply RoPE, inject, continue with generate;
    compare with transformers' own cached continuation, and re-position the prefix by +37.

    Section 2: the trained zoo (base, tuned, wide, odd, stranger): for base->X, the
    compatibility check, a ridge fit on calibration text, and `kvbridge eval` (native,
    transferred, no_prefix, zeroed, shuffled, random, no_rope_reapply, source) on held-out
    text, in one comparison table; where the check allows reusing the cache as is (same
    geometry: tuned, stranger) the unfitted identity transfer is measured too. Per-pair
    reports and the fitted mappings go to --report.
    Text comes from ../shared/corpora/tinyshakespeare.txt (or --corpus): calibration from its
    front, evaluation from its held-out last 10%. Without it, text is sampled from the zoo
    models themselves with fixed seeds (calibration: all of them; evaluation: each pair's
    target), and the output says so. No network. Takes about 1.5-2 minutes on 2 CPU cores.
    """
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    t0 = time.perf_counter()
    ok = True
    if not skip_identity:
        ok = identity_section(families, new_tokens)
    if not identity_only:
        names = tuple(p.strip() for p in pairs.split(",") if p.strip())
        zoo_section(pairs=names, corpus=corpus, report_dir=report_dir or None, tokens=tokens, top_k=top_k,
                    stride=stride, samples=samples, prefix_len=prefix_len, continuation_len=continuation_len,
                    greedy_tokens=greedy_tokens, bootstrap=bootstrap, seed=seed, identity_too=not no_identity_rows)
    click.echo(f"demo: {time.perf_counter() - t0:.1f} s")
    if not ok:
        raise SystemExit(1)
