"""The ``translator`` fitter against its own ridge start on one pair, same held-out samples (issue 31).

One process (the models load once): ``kvbridge fit --fitter translator`` through the library on
the calibration part of a corpus (a folder is split by file, as ``kvbridge fit``/``eval`` do;
a text file: its front), then ``evaluate`` twice on the same held-out samples:

- the ridge map the translator started from (its layers without the residual: the same solve
  from the same statistics), with ``native``, ``source``, ``transferred``, ``no_prefix``;
- the translator mapping, with ``native``, ``transferred``, ``no_prefix``;

and the per-sample paired difference of gap recovered (translator - ridge) with a bootstrap
interval. Results in ``OUT/results.json`` and a markdown table on stdout.

    flock /tmp/kvbridge-heavy.lock python bench/bench_translator.py --source S --target T --out OUT \\
        --corpus DIR --tokens 4096 --samples 8 --prefix-len 512 -o steps=200 -o rank=16
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def save(out: Path, results: dict) -> None:
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, default=str))
    tmp.replace(out / "results.json")


NAMES = ("nll", "kl_p95", "top1_agreement", "gap_recovered", "attention_cosine_mean", "attention_cosine_min")


def pick(cond: dict) -> dict:
    out = {}
    for n in NAMES:
        if n in cond:
            out[n] = cond[n]
            if f"{n}_ci" in cond:
                out[f"{n}_ci"] = cond[f"{n}_ci"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--corpus-heldout", type=float, default=0.1)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("-o", dest="options", action="append", default=[], help="translator option key=value")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--continuation-len", type=int, default=8)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report-only", action="store_true", help="print the table of OUT/results.json")
    ap.add_argument("--mapping", default=None, help="a translator mapping folder already fitted: skip the fit")
    args = ap.parse_args(argv)
    out = args.out
    if args.report_only:
        print(report(json.loads((out / "results.json").read_text())))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    t_all = time.perf_counter()
    results: dict = {"argv": sys.argv[1:], "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}

    from kvbridge.evaluate.corpus import eval_corpus
    from kvbridge.models import load

    corpus = Path(args.corpus)
    t0 = time.perf_counter()
    src, tgt = load(args.source, dtype=args.dtype), load(args.target, dtype=args.dtype)
    smodel, tmodel, ttok = src.model.eval(), tgt.model.eval(), tgt.tokenizer
    results["load_s"] = round(time.perf_counter() - t0, 1)
    log(f"loaded both models in {results['load_s']} s")

    from kvbridge.fit.mapping import FittedMapping
    from kvbridge.fit import fit as run_fit
    from kvbridge.fit.protocol import parse_pairs

    class _Bar:  # progress lines of the translator's stages in the log
        enabled = True

        def __call__(self, event):
            kind, tag, n = event
            if kind == "start":
                log(f"calibration pass {tag}: {n} tokens")

    t0 = time.perf_counter()
    mdir = Path(args.mapping) if args.mapping else out / "translator"
    if args.mapping:
        from kvbridge.fit.artifact import load_mapping

        mapping = load_mapping(mdir, source=smodel, target=tmodel)
    else:
        mapping = run_fit(
            src,
            tgt,
            fitter="translator",
            options=parse_pairs(args.options),
            corpus=str(corpus),  # the calibration part, as `kvbridge fit --corpus` reads it
            heldout=0.1,
            seed=0,
            **{k: getattr(args, k) for k in ("corpus_heldout", "stride", "batch_size", "seq_len", "tokens")},
            out=mdir,
            overwrite=True,
            distributed=None,
            progress=_Bar(),
        )
    results["fit_s"] = round(time.perf_counter() - t0, 1)
    rep = mapping.report
    results["fit"] = {
        "dir": str(mdir),
        "r2": rep.r2_summary,
        "params": rep.params,
        "training": rep.training,
        "calibration": {
            k: mapping.manifest["calibration"].get(k)
            for k in ("tokens", "observations_train", "observations_per_feature")
        },
    }
    tr = rep.training
    log(
        f"fit {results['fit_s']} s: R² {rep.r2_summary.get('mean')}; attention loss train "
        f"{tr['before']['train']['loss']:.4f} -> {tr['after']['train']['loss']:.4f}, held-out "
        f"{(tr['before']['heldout'] or {}).get('loss')} -> {(tr['after']['heldout'] or {}).get('loss')}"
    )
    save(out, results)
    ridge = FittedMapping(mapping.source_spec, mapping.target_spec, mapping.layers, fitter="ridge")

    from kvbridge.evaluate import corpus_samples, evaluate
    from kvbridge.evaluate.settings import EvalSettings

    ev = eval_corpus(corpus, mapping.manifest, args.corpus_heldout, explicit=False, allow=False, tokenizer=ttok)
    length = args.prefix_len + args.continuation_len + 1
    ids, data = corpus_samples([ev.tail], ttok, n=args.samples, length=length, fraction=1.0)
    data.update(ev.data)
    results["eval_data"] = data

    def run_eval(m, conds):
        cfg = EvalSettings(
            prefix_len=args.prefix_len,
            continuation_len=args.continuation_len,
            greedy_tokens=1,
            batch_size=4,
            top_k=5,
            top_p=0.9,
            seed=0,
            conditions=conds,
            attention=True,
            bootstrap=args.bootstrap,
        )
        t0 = time.perf_counter()
        res = evaluate(smodel, tmodel, m, ids, config=cfg, data=data, source_name=args.source, target_name=args.target)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        return res

    evals = {}
    for name, m, conds in (  # the translator first: a run cut short still has its row and the source line
        ("translator", mapping, ("native", "source", "transferred", "no_prefix")),
        ("ridge", ridge, ("native", "transferred", "no_prefix")),
    ):
        res = run_eval(m, conds)
        evals[name] = res
        (out / f"eval_{name}.json").write_text(json.dumps(res, indent=1, default=str))
        results[f"eval_{name}"] = {
            "wall_s": res["wall_s"],
            "conditions": {c: pick(v) for c, v in res["conditions"].items()},
            "attention_cosine_layers": res["conditions"]["transferred"].get("attention_cosine_layers"),
        }
        log(f"eval {name}: {res['wall_s']} s, gap recovered {res['conditions']['transferred'].get('gap_recovered')}")
        save(out, results)
    results["paired_translator_minus_ridge"] = paired(evals["ridge"], evals["translator"], args.bootstrap)
    results["wall_s"] = round(time.perf_counter() - t_all, 1)
    results["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    save(out, results)
    print(report(results))
    return 0


def _per_sample(res: dict, cond: str, name: str):
    c = res["conditions"].get(cond, {})
    for key in (f"{name}_per_sample", "per_sample"):
        v = c.get(key)
        if isinstance(v, dict):
            v = v.get(name)
        if isinstance(v, list):
            return v
    return None


def paired(ridge: dict, trans: dict, bootstrap: int) -> dict | None:
    """Mean per-sample NLL difference (translator - ridge) with a paired bootstrap interval, when
    the results carry per-sample values."""
    a, b = _per_sample(ridge, "transferred", "nll"), _per_sample(trans, "transferred", "nll")
    if not a or not b or len(a) != len(b):
        return None
    import torch

    d = torch.tensor(b, dtype=torch.float64) - torch.tensor(a, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, len(d), (bootstrap, len(d)), generator=g)
    means = d[idx].mean(1)
    return {"nll_diff": float(d.mean()), "nll_diff_ci": [float(means.quantile(0.025)), float(means.quantile(0.975))]}


def _f(x, spec="{:.3f}"):
    return "n/a" if x is None else spec.format(x)


def report(r: dict) -> str:
    lines = [
        "| condition | NLL | KL p95 | top-1 | gap recovered [95% CI] | attn cos mean | attn cos min |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [
        ("target native", r["eval_translator"]["conditions"]["native"]),
        ("source model alone", r["eval_translator"]["conditions"].get("source", {})),
        ("ridge (the translator's start)", (r.get("eval_ridge") or {}).get("conditions", {}).get("transferred", {})),
        ("translator", r["eval_translator"]["conditions"]["transferred"]),
        ("no prefix", r["eval_translator"]["conditions"]["no_prefix"]),
    ]
    for name, c in rows:
        ci = c.get("gap_recovered_ci")
        gap = _f(c.get("gap_recovered")) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        lines.append(
            f"| {name} | {_f(c.get('nll'))} | {_f(c.get('kl_p95'), '{:.2f}')} | {_f(c.get('top1_agreement'))} | {gap} "
            f"| {_f(c.get('attention_cosine_mean'))} | {_f(c.get('attention_cosine_min'))} |"
        )
    tr = r["fit"]["training"]
    lines.append("")
    lines.append(
        f"training (relative attention-output error, mean over layers): train {tr['before']['train']['loss']:.4f} -> "
        f"{tr['after']['train']['loss']:.4f}; held-out {_f((tr['before']['heldout'] or {}).get('loss'), '{:.4f}')} -> "
        f"{_f((tr['after']['heldout'] or {}).get('loss'), '{:.4f}')}; held-out attention cosine "
        f"{_f((tr['before']['heldout'] or {}).get('attention_cosine_mean'))} -> "
        f"{_f((tr['after']['heldout'] or {}).get('attention_cosine_mean'))}; ridge held-out R² {_f(r['fit']['r2'].get('mean'))}"
    )
    lines.append(
        f"collect {tr['collect_seconds']} s, {tr['steps']} + {tr['kl_steps']} steps in {tr['train_seconds']} s "
        f"({tr['seconds_per_step']} s/step); fit {r['fit_s']} s in all; wall {r.get('wall_s')} s; "
        f"peak RSS {r.get('peak_rss_gib')} GiB"
    )
    if r.get("paired_translator_minus_ridge"):
        p = r["paired_translator_minus_ridge"]
        lines.append(
            f"paired NLL difference translator - ridge: {p['nll_diff']:.3f} [{p['nll_diff_ci'][0]:.3f}, "
            f"{p['nll_diff_ci'][1]:.3f}]"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
