"""Multi-turn hand-off drift on the real adapter pair: SmolLM2-135M-Instruct <-> SmolLM2 + Shakespeare LoRA,
the cache mapped at each switch (ridge fitted both ways, as the adapter-pair run fits it) or given as it
is (plain reuse), against the same conversation re-prefilled at every switch
(:func:`kvbridge.harness.session.compare_handoff`).

    flock /tmp/kvbridge-heavy.lock python bench/harness_session_smollm2.py --turns 5 --tokens 16 --threads 2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

LINES = [
    "User: Tell me about the sea.\nAssistant:",
    "\nUser: And what of the moon?\nAssistant:",
    "\nUser: Who rules the waves?\nAssistant:",
    "\nUser: Say it as a poet would.\nAssistant:",
    "\nUser: One more line, please.\nAssistant:",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--calibration-tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    if a.threads:
        torch.set_num_threads(a.threads)
    from kvbridge.adapters import load_adapter_pair
    from kvbridge.adapters.pair import calibration_ids
    from kvbridge.adapters import DEFAULT_CORPUS
    from kvbridge.fit import fit
    from kvbridge.harness.session import compare_handoff, drift_table
    from kvbridge.transfer import IdentityMapping

    t0 = time.perf_counter()
    pair = load_adapter_pair()
    calib = calibration_ids(pair.tokenizer, Path(DEFAULT_CORPUS).read_text(encoding="utf-8"), a.calibration_tokens)
    up = fit(pair.base, pair.tuned, calib, top_k=1, stride=4, seed=0, distributed=None)
    down = fit(pair.tuned, pair.base, calib, top_k=1, stride=4, seed=0, distributed=None)
    t_prep = time.perf_counter() - t0
    models = {"base": pair.base, "lora": pair.tuned}
    script = [(("base", "lora")[i % 2], LINES[i % len(LINES)]) for i in range(a.turns)]
    out = {}
    for label, maps in (
        ("fitted ridge", {("base", "lora"): up, ("lora", "base"): down}),
        ("plain reuse (identity)", {("base", "lora"): IdentityMapping(), ("lora", "base"): IdentityMapping()}),
    ):
        t1 = time.perf_counter()
        res = compare_handoff(models, pair.tokenizer, maps, script, max_new_tokens=a.tokens)
        out[label] = res
        print(
            f"\n{label}: base <-> base+LoRA, {res['switches']} switches, {res['history_tokens']} tokens in all "
            f"({time.perf_counter() - t1:.0f} s)"
        )
        print(drift_table(res))
    print(f"\n(load + two fits {t_prep:.0f} s, {torch.get_num_threads()} threads)")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
