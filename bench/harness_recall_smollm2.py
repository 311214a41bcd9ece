"""In-context recall through the real adapter pair: SmolLM2-135M-Instruct -> SmolLM2 + the shipped LoRA.

The pair and the fitted mapping are built as the RESULTS.md adapter-pair run builds them
(:func:`kvbridge.adapters.pair.run_adapter_pair`: ridge, top-k 1, stride 4, 2,048 calibration tokens
from the front quarter of tiny-Shakespeare); then :func:`kvbridge.harness.run.run_harness` runs the
``recall`` task under target, source, transferred, plain reuse and no context (and, with
``--frontier R[,R...]``, the compute frontier's ``truncated@R`` / ``tail@R``: ``kvbridge harness --frontier``).

    flock /tmp/kvbridge-heavy.lock python bench/harness_recall_smollm2.py --lengths 256,1024 \\
        --positions 0.1,0.9 --n 4 --threads 2 --json recall.json --markdown
    python bench/harness_recall_smollm2.py --frontier 0.1,0.25 --json recall-frontier.json --markdown
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="256,1024")
    ap.add_argument("--positions", default="0.1,0.9")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calibration-tokens", type=int, default=2048)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--frontier", default=None, help="R[,R...]: also truncated@R and tail@R (harness --frontier)")
    ap.add_argument("--sink", type=int, default=4, help="sink tokens of the frontier's points")
    a = ap.parse_args(argv)
    from kvbridge.evaluate.settings import parse_frontier

    if a.frontier is not None:
        parse_frontier(a.frontier)  # a typo fails before the models load
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    if a.threads:
        torch.set_num_threads(a.threads)
    from kvbridge.adapters import load_adapter_pair
    from kvbridge.adapters.pair import calibration_ids
    from kvbridge.adapters import DEFAULT_CORPUS
    from kvbridge.fit import FitSettings, fit_run
    from kvbridge.run import model_run
    from kvbridge.harness.report import markdown, terminal_table
    from kvbridge.harness.run import load_tasks, run_harness

    t0 = time.perf_counter()
    pair = load_adapter_pair()
    t_load = time.perf_counter() - t0
    calib = calibration_ids(pair.tokenizer, Path(DEFAULT_CORPUS).read_text(encoding="utf-8"), a.calibration_tokens)
    t0 = time.perf_counter()
    names = (pair.base_name, f"{pair.base_name}+adapter")
    run = model_run(pair.base, pair.tuned, FitSettings(top_k=1, stride=4, seed=0), names=names)
    mapping = fit_run(run, data=calib, distributed=None)
    t_fit = time.perf_counter() - t0
    tasks = load_tasks(
        ["recall"], {"recall": {"lengths": a.lengths, "positions": a.positions, "n": a.n, "seed": a.seed}}
    )
    t0 = time.perf_counter()
    res = run_harness(
        pair.base,
        pair.tuned,
        mapping,
        pair.tokenizer,
        tasks,
        frontier=a.frontier,
        sink=a.sink,
        bootstrap=a.bootstrap,
        seed=a.seed,
    )
    res["source"]["name"], res["target"]["name"] = "smollm2", "smollm2+shakespeare-LoRA"
    res["mapping"] = {"name": "ridge top-k 1 stride 4", "calibration_tokens": int(calib.numel())}
    t_run = time.perf_counter() - t0
    res["timing"].update(load_s=t_load, fit_s=t_fit, run_s=t_run, threads=torch.get_num_threads())
    print(markdown(res) if a.markdown else terminal_table(res))
    print(f"\n(load {t_load:.0f} s, fit {t_fit:.0f} s, harness {t_run:.0f} s, {torch.get_num_threads()} threads)")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
