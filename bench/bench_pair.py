"""The paper's protocol on a real family pair: Qwen2.5-Coder 0.5B -> 1.5B or back (issue 20), through the library.

Either direction: nothing below depends on which model is the larger one. ``source`` is the
model that produced the cache (its ``source`` condition is that model alone: in the reverse
direction 1.5B -> 0.5B it is the *larger* model, so its gap recovered may exceed 1).

One run (one process: the models load once) does, on Python source code:

1. the corpus: the running interpreter's standard library (``sysconfig.get_paths()['stdlib']``),
   its ``.py`` files outside ``site-packages``/``dist-packages`` and the test suites, copied
   into ``OUT/stdlib-corpus`` (a folder corpus: ``kvbridge fit/eval --corpus`` split it by a
   hash of each file's relative path, 10% of the files held out; :mod:`kvbridge.corpus`);
2. ``fit`` (ridge) of SOURCE -> TARGET on the calibration files, ``--tokens`` tokens; the
   paired statistics are accumulated **once** and every fit of the ``--grid`` (top-k x alpha)
   is solved from them (the forwards are the cost; a re-fit with other options reuses the
   statistics, which gives the mapping a separate ``kvbridge fit`` with those options gives);
3. ``eval`` of the first grid mapping on held-out files with the conditions native, source,
   transferred, no_rope_reapply, no_prefix (paired bootstrap intervals); the other grid
   mappings with native + transferred + no_prefix (the floor gap recovered needs);
4. the layer-selective recompute curve (before the other grid mappings' evals) of the first mapping (target mode, greedy group
   search on calibration files; nested sets 0..30% of the target's layers).

Results: ``OUT/results.json`` (updated after every step) and a markdown summary on stdout
(``--report-only`` prints it again). Sizes are flags; see RESULTS.md for the commands run.

    flock /tmp/kvbridge-heavy.lock python bench/bench_pair.py --out /tmp/pair-run \\
        --source ~/.cache/kvbridge/models/qwen2.5-coder-0.5b/... --target .../qwen2.5-coder-1.5b/...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import sys
import sysconfig
import time
from pathlib import Path

CONDITIONS = ("native", "source", "transferred", "no_rope_reapply", "no_prefix")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def stdlib_corpus(dest: Path) -> Path:
    """Copy the interpreter's stdlib .py files (no site-packages, no test suites) into ``dest``."""
    src = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    if dest.is_dir():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for f in sorted(src.rglob("*.py")):
        rel = f.relative_to(src)
        if skip & set(rel.parts) or not f.is_file():
            continue
        out = tmp / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, out)
    tmp.rename(dest)
    return dest


class StatsCache:
    """Reuse the paired statistics across fits in this process (same token ids and sampling)."""

    def __init__(self):
        from kvbridge.fit.calibrate import PairedCalibration

        self.orig = PairedCalibration.accumulate
        self.cache: dict = {}
        self.forward_runs = 0
        cache = self

        def accumulate(cal, jobs, *, tag="pass"):
            ids = hashlib.sha256(cal.sequences.numpy().tobytes()).hexdigest()
            c = cal.config
            key = (
                ids,
                c.stride,
                c.skip,
                c.heldout,
                c.seed,
                tuple(
                    (
                        j.src_layers,
                        j.tgt_layers,
                        j.xx_block,
                        repr(getattr(j, "supports", None)),
                        getattr(j, "weighted", 0),
                    )
                    for j in jobs
                ),
            )
            if key in cache.cache:
                for job, state in zip(jobs, cache.cache[key]):
                    job.__dict__.update(state)  # shared, read-only from here on: solving does not update
                return jobs
            cache.forward_runs += 1
            out = cache.orig(cal, jobs, tag=tag)
            cache.cache[key] = [dict(j.__dict__) for j in jobs]
            return out

        PairedCalibration.accumulate = accumulate


class PrefillReuse:
    """A host whose family adapters return the state of an earlier ``extract`` again for the same model and
    token ids: ``evaluate`` of several mappings on the same samples runs the target's native prefill and the
    source's prefill once (the other mappings' evals then cost the transfer and the continuations).

    Exact reuse: a state is the clone ``extract`` made, read (never written) by the conditions; the test
    checks the results equal a run without it. Held in memory for the whole run (at prefix 2,048 on the
    Qwen pair about 117 MB a sample for the 1.5B, 50 MB for the 0.5B).
    """

    def __init__(self, host):
        self._host = host
        self.states: dict = {}
        self.hits = 0
        self.misses = 0

    def __getattr__(self, name):
        return getattr(self._host, name)

    def adapter_for(self, config):
        return _ReuseAdapter(self._host.adapter_for(config), self)

    def adapter_of(self, model):
        return _ReuseAdapter(self._host.adapter_of(model), self)


class _ReuseAdapter:
    def __init__(self, inner, owner: PrefillReuse):
        self._inner, self._owner = inner, owner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def extract(self, model, input_ids, attention_mask=None, **kwargs):
        if attention_mask is not None:
            return self._inner.extract(model, input_ids, attention_mask, **kwargs)
        ids = input_ids.detach().cpu().contiguous()
        key = (id(model), tuple(ids.shape), hashlib.sha256(ids.numpy().tobytes()).hexdigest())
        owner = self._owner
        if key in owner.states:
            owner.hits += 1
            return owner.states[key]
        owner.misses += 1
        state = owner.states[key] = self._inner.extract(model, input_ids, **kwargs)
        return state


def mapping_row(mdir: Path, manifest: dict) -> dict:
    """A fits row for a mapping folder made elsewhere (``--add-mapping``: e.g. a translator), from its manifest."""
    fitter = manifest.get("fitter") or {}
    params = fitter.get("params") or {}
    cal = manifest.get("calibration") or {}
    training = manifest.get("training") or {}
    loss = {when: ((training.get(when) or {}).get("heldout") or {}).get("loss") for when in ("before", "after")}
    r2v = (manifest.get("heldout_r2") or {}).get("v")
    per_layer_v = [sum(r) / len(r) for r in r2v] if r2v else []
    return {
        "fitter": fitter.get("name"),
        "top_k": params.get("top_k"),
        "alpha": str(params.get("alpha")),
        "options": {k: params[k] for k in ("support", "weighting") if k in params},
        "params": params,
        "dir": str(mdir),
        "seconds": None,
        "tokens": cal.get("tokens"),
        "observations_per_feature": cal.get("observations_per_feature"),
        "r2": manifest.get("r2_summary") or {},
        "layers_v_below_0.5": sum(1 for x in per_layer_v if x < 0.5),
        "training_heldout_loss": loss,
        "training_tokens": (training.get("train_sequences") or 0) * cal.get("seq_len", 0) or None,
        "residual": manifest.get("residual"),
    }


def parse_grid(item: str) -> tuple:
    """``TOPK:ALPHA[:KEY=VALUE+KEY=VALUE]`` -> ``(k, alpha, {key: value})`` (``all``: every source layer)."""
    parts = item.split(":")
    k = 99 if parts[0] == "all" else int(parts[0])
    extra = dict(kv.split("=", 1) for kv in parts[2].split("+")) if len(parts) > 2 and parts[2] else {}
    return k, parts[1], extra


def save(out: Path, results: dict) -> None:
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, default=str))
    tmp.replace(out / "results.json")


def pick(
    cond: dict,
    names=(
        "nll",
        "kl_p95",
        "top1_agreement",
        "gap_recovered",
        "retention",
        "greedy_agreement",
        "attention_cosine_min",
        "attention_cosine_mean",
    ),
) -> dict:
    out = {}
    for n in names:
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
    ap.add_argument("--corpus", default=None, help="a folder corpus (default: the stdlib copy in OUT)")
    ap.add_argument("--corpus-heldout", type=float, default=0.1)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument(
        "--grid",
        default="4:0.01",
        help="fits from one pass of statistics: TOPK:ALPHA[:KEY=VALUE+KEY=VALUE],... (the first is the main "
        "mapping; the third field: more ridge options, e.g. 4:0.01:support=head-local+weighting=attention)",
    )
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=64)
    ap.add_argument("--continuation-len", type=int, default=8)
    ap.add_argument("--greedy-tokens", type=int, default=8)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--recompute-max", type=float, default=0.3, help="recompute curve up to this share of layers")
    ap.add_argument("--recompute-sizes", default="1,2,3,4,6,8", help="layer counts of the curve (within the max)")
    ap.add_argument("--recompute-select", default="greedy", choices=("greedy", "profile", "prefix"))
    ap.add_argument("--skip-recompute", action="store_true")
    ap.add_argument("--skip-variants", action="store_true")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument(
        "--fits-from",
        default=None,
        help="skip the fits: evaluate the mappings a finished run's results.json lists (a run stopped "
        "after its fits); everything after the fits as usual",
    )
    ap.add_argument(
        "--variants-only",
        action="store_true",
        help="a second run: eval (native + transferred) every OUT/map-* but the first grid one, "
        "on the same held-out samples (results_variants.json)",
    )
    ap.add_argument(
        "--only", default=None, help="--variants-only / --fits-from: these map-* folder names (comma-separated)"
    )
    ap.add_argument(
        "--add-mapping",
        action="append",
        default=[],
        type=Path,
        help="--fits-from: evaluate this mapping folder too (any fitter, e.g. a translator), as one more "
        "variant row (repeatable)",
    )
    ap.add_argument(
        "--eval-batch-size", type=int, default=8, help="samples per forward in the evals (lower at long prefixes)"
    )
    ap.add_argument(
        "--reuse-prefills",
        action="store_true",
        help="run the target's and the source's prefill of each sample once for all the evals of this run "
        "(exact reuse; the variant evals then time no prefill)",
    )
    ap.add_argument(
        "--tokens-only",
        action="store_true",
        help="a second run: token-selective recompute of the main mapping's transfer on the main run's "
        "held-out samples, one point per rule x ratio (recompute_tokens.json)",
    )
    ap.add_argument("--token-ratios", default="0.1,0.25,0.5", help="--tokens-only: shares of the prefix tokens")
    ap.add_argument("--token-rules", default="deviation,last", help="--tokens-only: kvbridge.recompute.tokens.RULES")
    args = ap.parse_args(argv)
    out = args.out
    if args.report_only:
        r = json.loads((out / "results.json").read_text())
        if (out / "results_variants.json").is_file():
            r["eval_variants"] = json.loads((out / "results_variants.json").read_text())["eval_variants"]
        if (out / "recompute_tokens.json").is_file():
            r["recompute_tokens"] = json.loads((out / "recompute_tokens.json").read_text())
        print(report(r))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    t_all = time.perf_counter()
    results: dict = {
        "argv": sys.argv[1:],
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "torch": torch.__version__,
        "threads": args.threads,
    }

    if args.variants_only:
        return variants_only(args, out)
    if args.tokens_only:
        return tokens_only(args, out)
    corpus = Path(args.corpus) if args.corpus else stdlib_corpus(out / "stdlib-corpus")
    from kvbridge.evaluate.corpus import eval_corpus
    from kvbridge.fit.calibrate import calibration_texts

    texts, sha, split = calibration_texts(corpus, args.corpus_heldout)
    from kvbridge.corpus import read_corpus

    rec = read_corpus(corpus).record(split)
    results["corpus"] = {k: rec[k] for k in ("path", "sha256", "files_count", "bytes", "split")}
    results["corpus"]["stdlib"] = sysconfig.get_paths()["stdlib"] if not args.corpus else None
    log(f"corpus {corpus}: {rec['files_count']} files, {rec['bytes']:,} bytes, split {rec['split']}")

    from kvbridge.models import load

    t0 = time.perf_counter()
    src = load(args.source, dtype=args.dtype)
    tgt = load(args.target, dtype=args.dtype)
    smodel, stok, tmodel, ttok = src.model.eval(), src.tokenizer, tgt.model.eval(), tgt.tokenizer
    results["load_s"] = round(time.perf_counter() - t0, 1)
    results["peak_rss_gib_after_load"] = round(peak_rss_gib(), 2)
    log(f"loaded both models in {results['load_s']} s; peak RSS {results['peak_rss_gib_after_load']} GiB")

    # -- fit: one pass of statistics, every grid point solved from it ---------------------------------
    from kvbridge.fit.calibrate import check_same_tokens
    from kvbridge.fit import FitSettings, fit as run_fit
    from kvbridge.fit.solve import FitError

    check_same_tokens(texts, stok, ttok)
    cache = StatsCache()
    grid = [parse_grid(g) for g in args.grid.split(",")]
    given = {k: getattr(args, k) for k in ("corpus_heldout", "stride", "batch_size", "seq_len", "tokens")}
    cal_settings = FitSettings(
        corpus=str(corpus), heldout=0.1, seed=0, **given
    )  # the calibration part, as fit reads it
    results["fits"] = []
    maps = []
    if args.fits_from:  # a run whose fits finished (its results.json and map-* folders): evaluate those
        from kvbridge.fit.artifact import load_mapping

        prior = json.loads(Path(args.fits_from).read_text())
        results["fits"] = prior["fits"]
        results["fits_from"] = {
            "file": args.fits_from,
            "started": prior.get("started"),
            "argv": prior.get("argv"),
            "load_s": prior.get("load_s"),
        }
        if args.only:
            keep = args.only.split(",")
            results["fits"] = sorted(
                (f for f in prior["fits"] if Path(f.get("dir", "")).name in keep),
                key=lambda f: keep.index(Path(f["dir"]).name),
            )
        maps = [
            (Path(f["dir"]), load_mapping(f["dir"], source=smodel, target=tmodel))
            for f in results["fits"]
            if "dir" in f
        ]
        for extra_dir in args.add_mapping:
            mapping = load_mapping(extra_dir, source=smodel, target=tmodel)
            results["fits"].append(mapping_row(extra_dir, mapping.manifest))
            maps.append((extra_dir, mapping))
        log(f"fits from {args.fits_from}: {[m[0].name for m in maps]}")
        grid = []
    for k, alpha, extra in grid:
        t0 = time.perf_counter()
        alpha_v = alpha if alpha == "auto" else float(alpha)
        mdir = out / (f"map-k{k}-a{alpha}" + "".join(f"-{v}" for v in extra.values()))
        try:
            mapping = run_fit(
                src,
                tgt,
                settings=cal_settings,
                options={"top_k": min(k, smodel.config.num_hidden_layers), "alpha": alpha_v, **extra},
                out=mdir,
                overwrite=True,
                distributed=None,
            )
        except FitError as e:  # e.g. top-k all of the 1.5B: more features than observations; a result, not a crash
            if not maps:
                raise
            results["fits"].append(
                {
                    "top_k": k,
                    "alpha": alpha,
                    "options": extra,
                    "error": str(e),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            log(f"fit k={k} alpha={alpha}: refused: {e}")
            save(out, results)
            continue
        rep = mapping.report
        cal = mapping.manifest.get("calibration", {})
        summ = rep.r2_summary or {}
        r2k, r2v = rep.heldout_r2.get("k"), rep.heldout_r2.get("v")
        per_layer_v = [sum(r) / len(r) for r in r2v] if r2v else None
        per_layer_k = [sum(r) / len(r) for r in r2k] if r2k else None
        row = {
            "top_k": k,
            "alpha": alpha,
            "options": extra,
            "selection": rep.params.get("selection"),
            "passes": rep.passes,
            "dir": str(mdir),
            "seconds": round(time.perf_counter() - t0, 1),
            "tokens": cal.get("tokens"),
            "observations_train": cal.get("observations_train"),
            "observations_per_feature": cal.get("observations_per_feature"),
            "r2": summ,
            "r2_k_per_layer": per_layer_k,
            "r2_v_per_layer": per_layer_v,
            "layers_v_below_0.5": sum(1 for x in (per_layer_v or []) if x < 0.5),
            "alpha_chosen": rep.alpha_chosen if alpha == "auto" else None,
            "layer_selection": rep.layer_selection,
            "warnings": list(rep.warnings),
            "forward_passes_so_far": cache.forward_runs,
        }
        results["fits"].append(row)
        maps.append((mdir, mapping))
        log(
            f"fit k={k} alpha={alpha} {extra}: {row['seconds']} s, R² {summ.get('mean')} (K {summ.get('mean_k')}, "
            f"V {summ.get('mean_v')}), obs/feature {row['observations_per_feature']}"
        )
        save(out, results)
    results["peak_rss_gib_after_fit"] = round(peak_rss_gib(), 2)

    # -- eval on held-out files ----------------------------------------------------------------------
    from kvbridge.evaluate import corpus_samples, evaluate
    from kvbridge.evaluate.settings import EvalSettings

    main_dir, main_map = maps[0]
    ev = eval_corpus(corpus, main_map.manifest, args.corpus_heldout, explicit=False, allow=False, tokenizer=ttok)
    length = args.prefix_len + args.continuation_len + 1
    ids, data = corpus_samples([ev.tail], ttok, n=args.samples, length=length, fraction=1.0)
    data.update(ev.data)
    results["eval_data"] = data

    if args.reuse_prefills:
        from kvbridge.plugins import get_host

        reuse = PrefillReuse(get_host())
    else:
        reuse = None

    def run_eval(mapping, conds, greedy):
        cfg = EvalSettings(
            prefix_len=args.prefix_len,
            continuation_len=args.continuation_len,
            greedy_tokens=greedy,
            batch_size=args.eval_batch_size,
            top_k=5,
            top_p=0.9,
            seed=0,
            conditions=conds,
            attention=True,
            bootstrap=args.bootstrap,
        )
        t0 = time.perf_counter()
        res = evaluate(
            smodel,
            tmodel,
            mapping,
            ids,
            config=cfg,
            data=data,
            source_name=args.source,
            target_name=args.target,
            host=reuse,
        )
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        if reuse is not None:
            res["prefill_reuse"] = {"hits": reuse.hits, "misses": reuse.misses}
        return res

    log(f"eval main mapping: {args.samples} samples x {length} tokens, conditions {CONDITIONS}")
    res = run_eval(main_map, CONDITIONS, args.greedy_tokens)
    results["eval_main"] = {
        "mapping": str(main_dir),
        "wall_s": res["wall_s"],
        "timing": res["timing"],
        "conditions": {c: pick(v) for c, v in res["conditions"].items()},
        "comparisons": res.get("comparisons"),
        "attention_cosine_layers": res["conditions"]["transferred"].get("attention_cosine_layers"),
    }
    fit0 = results["fits"][0]
    cos = results["eval_main"]["attention_cosine_layers"]
    if cos and fit0["r2_k_per_layer"] and len(cos) == len(fit0["r2_k_per_layer"]):
        results["r2_vs_attention"] = {kind: pearson(fit0[f"r2_{kind}_per_layer"], cos) for kind in ("k", "v")}
    (out / "eval_main.json").write_text(json.dumps(res, indent=1, default=str))
    results["peak_rss_gib_after_eval"] = round(peak_rss_gib(), 2)
    log(f"eval main: {res['wall_s']} s")
    save(out, results)

    # -- the recompute curve -----------------------------------------------------------------------
    if not args.skip_recompute:
        from kvbridge.evaluate import windows
        from kvbridge.recompute import curve
        from kvbridge.recompute.layers import calibration
        from kvbridge.recompute.settings import CurvePlan

        t0 = time.perf_counter()
        front = "\n".join(ev.profile_texts)
        stream = torch.tensor(ttok(front[:400_000], add_special_tokens=False)["input_ids"], dtype=torch.long)
        cal_ids = windows(stream, 16, length)  # calibration files only: never the held-out ones
        calib = calibration(smodel, tmodel, main_map, cal_ids, args.prefix_len, args.continuation_len, batch_size=8)
        sweep = curve.layer_sweep(tmodel, calib, max_share=args.recompute_max, method=args.recompute_select)
        want = {int(x) for x in args.recompute_sizes.split(",")}
        points = [p for p in sweep if len(p[1]) in want]
        dropped = sorted(want - {len(p[1]) for p in points})
        if dropped:  # e.g. 8 layers of a 24-layer target is 33%, above the default --recompute-max 0.3
            log(
                f"recompute: sizes {dropped} exceed --recompute-max {args.recompute_max} of the target's "
                f"{tmodel.config.num_hidden_layers} layers: not measured (raise --recompute-max to include them)"
            )
        results["recompute_selection_s"] = round(time.perf_counter() - t0, 1)
        log(
            f"recompute: {len(points)} points selected in {results['recompute_selection_s']} s: "
            f"{[list(p[1]) for p in points]}"
        )
        curve_res = curve.run_curve(
            curve_run(smodel, tmodel, args), main_map, ids, CurvePlan(layer_points=tuple(points))
        )
        (out / "recompute.json").write_text(json.dumps(curve_res, indent=1, default=str))
        results["recompute"] = {
            "wall_s": round(time.perf_counter() - t0, 1),
            "select": args.recompute_select,
            "layers": [list(p[1]) for p in points],
            "curve": curve_res,
        }
        log(f"recompute curve: {results['recompute']['wall_s']} s")
        save(out, results)

    if not args.skip_variants:  # after the recompute curve: the optional part last
        results["eval_variants"] = []
        for mdir, mapping in maps[1:]:
            res = run_eval(mapping, ("native", "transferred", "no_prefix"), 1)  # the floor: gap recovered needs it
            results["eval_variants"].append(
                {
                    "mapping": str(mdir),
                    "wall_s": res["wall_s"],
                    "transferred": pick(res["conditions"]["transferred"]),
                    "native_nll": res["conditions"]["native"].get("nll"),
                    "no_prefix_nll": res["conditions"]["no_prefix"].get("nll"),
                    "prefill_reuse": res.get("prefill_reuse"),
                }
            )
            log(f"eval {mdir.name}: gap recovered {res['conditions']['transferred'].get('gap_recovered')}")
            save(out, results)

    results["wall_s"] = round(time.perf_counter() - t_all, 1)
    results["peak_rss_gib"] = round(peak_rss_gib(), 2)
    save(out, results)
    print(report(results))
    return 0


def main_run_samples(args, out: Path):
    """``(results, source model, target model, the main mapping, ids, data)``: both models loaded and
    the main run's held-out samples drawn again (checked to be the same text), for the follow-up modes."""
    from kvbridge.evaluate import corpus_samples
    from kvbridge.evaluate.corpus import eval_corpus
    from kvbridge.fit.artifact import load_mapping
    from kvbridge.models import load

    main = json.loads((out / "results.json").read_text())
    t0 = time.perf_counter()
    src, tgt = load(args.source, dtype=args.dtype), load(args.target, dtype=args.dtype)
    smodel, tmodel, ttok = src.model.eval(), tgt.model.eval(), tgt.tokenizer
    log(f"loaded in {time.perf_counter() - t0:.1f} s")
    mapping = load_mapping(main["fits"][0]["dir"], source=smodel, target=tmodel)
    ev = eval_corpus(
        Path(main["corpus"]["path"]), mapping.manifest, args.corpus_heldout, explicit=False, allow=False, tokenizer=ttok
    )
    length = args.prefix_len + args.continuation_len + 1
    ids, data = corpus_samples([ev.tail], ttok, n=args.samples, length=length, fraction=1.0)
    assert data["heldout_tokens"] == main["eval_data"]["heldout_tokens"], "not the main run's held-out text"
    return main, smodel, tmodel, mapping, ids, data


def variants_only(args, out: Path) -> int:
    """Eval every grid mapping but the main one (native + transferred), same samples as the main run."""
    import torch

    from kvbridge.evaluate import evaluate
    from kvbridge.evaluate.settings import EvalSettings
    from kvbridge.fit.artifact import load_mapping

    main, smodel, tmodel, _, ids, data = main_run_samples(args, out)
    dirs = [
        Path(f["dir"])
        for f in main["fits"][1:]
        if "dir" in f  # a refused fit has no folder
        and (not args.only or Path(f["dir"]).name in args.only.split(","))
    ]
    rows = []
    for d in dirs:
        mapping = load_mapping(d, source=smodel, target=tmodel)
        cfg = EvalSettings(
            prefix_len=args.prefix_len,
            continuation_len=args.continuation_len,
            greedy_tokens=1,
            batch_size=8,
            top_k=5,
            top_p=0.9,
            seed=0,
            conditions=("native", "transferred", "no_prefix"),  # the floor: gap recovered needs it
            attention=False,
            bootstrap=args.bootstrap,
        )
        t0 = time.perf_counter()
        with torch.no_grad():
            res = evaluate(smodel, tmodel, mapping, ids, config=cfg, data=data)
        rows.append(
            {
                "mapping": str(d),
                "wall_s": round(time.perf_counter() - t0, 1),
                "transferred": pick(res["conditions"]["transferred"]),
            }
        )
        log(
            f"eval {d.name}: gap recovered {res['conditions']['transferred'].get('gap_recovered')} "
            f"({rows[-1]['wall_s']} s)"
        )
        (out / "results_variants.json").write_text(
            json.dumps({"eval_variants": rows, "peak_rss_gib": peak_rss_gib()}, indent=1, default=str)
        )
    return 0


def curve_run(smodel, tmodel, args):
    """The run the recompute curve reads: target mode, 8 samples a batch, no attention capture, seed 0."""
    from kvbridge.evaluate.settings import EvalSettings, RecomputeSettings
    from kvbridge.run import model_run

    settings = EvalSettings(
        mapping="identity",  # the mapping object is passed to run_curve itself
        corpus=str(args.corpus or "stdlib"),  # a label: the samples are passed to run_curve
        prefix_len=args.prefix_len,
        continuation_len=args.continuation_len,
        batch_size=8,
        attention=False,
        bootstrap=args.bootstrap,
        seed=0,
        recompute=RecomputeSettings(mode="target"),
    )
    return model_run(smodel, tmodel, settings)


def tokens_only(args, out: Path) -> int:
    """Token-selective recompute points (every rule x ratio) on the main run's samples and mapping."""
    import torch

    from kvbridge.recompute.curve import run_curve
    from kvbridge.recompute.settings import CurvePlan

    main, smodel, tmodel, mapping, ids, _ = main_run_samples(args, out)
    ratios = [float(x) for x in args.token_ratios.split(",")]
    rules = tuple(args.token_rules.split(","))
    t0 = time.perf_counter()
    with torch.no_grad():
        res = run_curve(
            curve_run(smodel, tmodel, args), mapping, ids, CurvePlan(token_ratios=tuple(ratios), token_rules=rules)
        )
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["mapping"] = main["fits"][0]["dir"]
    res["peak_rss_gib"] = round(peak_rss_gib(), 2)
    tmp = out / "recompute_tokens.json.tmp"
    tmp.write_text(json.dumps(res, indent=1, default=str))
    tmp.replace(out / "recompute_tokens.json")
    for name, c in res["conditions"].items():
        log(f"{name}: gap recovered {c.get('gap_recovered')} flop share {c.get('recompute_flop_share')}")
    return 0


def pearson(a, b):
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    sa = sum((x - ma) ** 2 for x in a) ** 0.5
    sb = sum((y - mb) ** 2 for y in b) ** 0.5
    return None if sa == 0 or sb == 0 else sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (sa * sb)


def _f(x, spec="{:.3f}"):
    return "n/a" if x is None else spec.format(x)


def _ci(c: dict, name: str) -> str:
    v, ci = c.get(name), c.get(f"{name}_ci")
    if v is None:
        return "n/a"
    return f"{v:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and None not in ci else "")


def setting_name(f: dict) -> str:
    opts = f.get("options") or {}
    if f.get("fitter") == "translator":
        p, res = f.get("params") or {}, f.get("residual") or {}
        loss = f.get("training_heldout_loss") or {}
        held = (
            f", held-out attn loss {_f(loss.get('before'))} -> {_f(loss.get('after'))}"
            if loss.get("before") is not None
            else ""
        )
        return (
            f"translator ({res.get('kind', '?')} {res.get('size', '?')}, {p.get('steps')} steps, "
            f"{f.get('tokens')} tokens{held}) on ridge k={f['top_k']} alpha={f['alpha']} "
            f"support={opts.get('support', 'layers')}"
        )
    sel = (f.get("selection") or {}).get("chosen")
    weighting = f"weighting={opts.get('weighting', 'uniform')}"
    if sel:
        return (
            f"ridge select=kl (k <= {f['top_k']}, {weighting}): chose support={sel['support']} k={sel['top_k']} "
            f"alpha={sel['alpha']}"
        )
    return f"ridge k={f['top_k']} alpha={f['alpha']} support={opts.get('support', 'layers')} {weighting}"


def fitter_table(r: dict) -> list:
    """One row per fitter setting (main eval for the first, the variant evals for the others) with the
    source-alone and native lines of the main eval (same samples)."""
    em = r.get("eval_main")
    if not em:
        return []
    evals = {em["mapping"]: em["conditions"]["transferred"]}
    evals.update({v["mapping"]: v["transferred"] for v in r.get("eval_variants") or []})
    rows = [
        "",
        "| fitter setting | held-out R² (K / V) | gap recovered [95% CI] | KL p95 | attn-output cos mean / min |",
        "|---|---:|---:|---:|---:|",
    ]
    for f in r.get("fits", []):
        c = evals.get(f.get("dir"))
        s = f.get("r2") or {}
        if f.get("error") or c is None:
            continue
        rows.append(
            f"| {setting_name(f)} | {_f(s.get('mean'))} ({_f(s.get('mean_k'))} / {_f(s.get('mean_v'))}) | "
            f"{_ci(c, 'gap_recovered')} | {_f(c.get('kl_p95'))} | {_f(c.get('attention_cosine_mean'))} / "
            f"{_f(c.get('attention_cosine_min'))} |"
        )
    for name in ("source", "native"):
        c = em["conditions"].get(name)
        if c:
            label = "source model alone" if name == "source" else "target native"
            rows.append(
                f"| {label} | | {_ci(c, 'gap_recovered')} | {_f(c.get('kl_p95'))} | "
                f"{_f(c.get('attention_cosine_mean'))} / {_f(c.get('attention_cosine_min'))} |"
            )
    return rows


def report(r: dict) -> str:
    out = []
    for f in r.get("fits", []):
        if f.get("error"):
            out.append(f"fit top-k {f['top_k']} alpha {f['alpha']}: refused: {f['error']}")
            continue
        s = f["r2"] or {}
        out.append(
            f"fit top-k {f['top_k']} alpha {f['alpha']}: {f['tokens']} tokens, {f['observations_per_feature']} "
            f"obs/feature, held-out R² mean {_f(s.get('mean'))} (K {_f(s.get('mean_k'))}, V "
            f"{_f(s.get('mean_v'))}, min {_f(s.get('min'))}); {f['layers_v_below_0.5']} target layers with "
            f"mean V R² < 0.5; {f['seconds']} s"
        )
    em = r.get("eval_main")
    if em:
        out += [
            "",
            "| condition | NLL | KL p95 | top-1 | gap recovered | greedy agree | attn cos min |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for c, v in em["conditions"].items():
            out.append(
                f"| {c} | {_f(v.get('nll'))} | {_f(v.get('kl_p95'))} | {_f(v.get('top1_agreement'))} | "
                f"{_ci(v, 'gap_recovered')} | {_f(v.get('greedy_agreement'))} | "
                f"{_f(v.get('attention_cosine_min'))} |"
            )
        t = em["timing"]
        out.append(
            f"\ntiming: target prefill {_f(t.get('target_prefill_ms'), '{:.0f}')} ms, source prefill "
            f"{_f(t.get('source_prefill_ms'), '{:.0f}')} ms, transfer {_f(t.get('transfer_ms'), '{:.0f}')} ms "
            f"for {t.get('prefix_tokens')} prefix tokens: speed-up "
            f"{_f(t.get('transfer_speedup_vs_prefill'), '{:.1f}')}x, counting the source prefill "
            f"{_f(t.get('transfer_speedup_with_source_prefill'), '{:.2f}')}x; eval {em['wall_s']} s"
        )
    rv = r.get("r2_vs_attention")
    if rv:
        out.append(
            f"per target layer, Pearson r of held-out R² with the transferred attention-output cosine: "
            f"K {_f(rv.get('k'), '{:.2f}')}, V {_f(rv.get('v'), '{:.2f}')}"
        )
    for v in r.get("eval_variants") or []:
        out.append(
            f"variant {Path(v['mapping']).name}: transferred gap recovered {_ci(v['transferred'], 'gap_recovered')}, "
            f"KL p95 {_f(v['transferred'].get('kl_p95'))}, top-1 {_f(v['transferred'].get('top1_agreement'))}"
        )
    out += fitter_table(r)
    rc = r.get("recompute")
    if rc:
        out += [
            "",
            f"recompute curve ({rc['select']} selection, target mode, same samples; source alone beside it):",
            "| point | layers recomputed | share of layers | FLOP share | gap recovered | KL p95 | top-1 |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for name, p in rc["curve"].get("conditions", {}).items():
            out.append(
                f"| {name} | {p.get('layers', '')} | {_f(p.get('share'), '{:.2f}')} | "
                f"{_f(p.get('recompute_flop_share'), '{:.2f}')} | {_ci(p, 'gap_recovered')} | "
                f"{_f(p.get('kl_p95'))} | {_f(p.get('top1_agreement'))} |"
            )
        src = ((r.get("eval_main") or {}).get("conditions") or {}).get("source")
        if src:
            out.append(
                f"| source alone (eval above) | | | | {_ci(src, 'gap_recovered')} | {_f(src.get('kl_p95'))} | "
                f"{_f(src.get('top1_agreement'))} |"
            )
    rt = r.get("recompute_tokens")
    if rt:
        out += [
            "",
            f"token-selective recompute (check layer {rt.get('check_layer')}, target, same samples; "
            f"tokens@R = deviation rule, last@R = the prefix's last R tokens; {rt.get('wall_s')} s):",
            "| point | token share | FLOP share of the target's prefill | gap recovered | KL p95 | top-1 |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, p in rt.get("conditions", {}).items():
            out.append(
                f"| {name} | {_f(p.get('share'), '{:.2f}')} | {_f(p.get('recompute_flop_share'), '{:.2f}')} | "
                f"{_ci(p, 'gap_recovered')} | {_f(p.get('kl_p95'))} | {_f(p.get('top1_agreement'))} |"
            )
        src = ((r.get("eval_main") or {}).get("conditions") or {}).get("source")
        if src:
            out.append(
                f"| source alone (main eval) | | | {_ci(src, 'gap_recovered')} | {_f(src.get('kl_p95'))} | "
                f"{_f(src.get('top1_agreement'))} |"
            )
    out.append(f"\nwall {r.get('wall_s')} s, peak RSS {r.get('peak_rss_gib')} GiB, load {r.get('load_s')} s")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
