"""Multi-turn hand-off drift on the zoo: base -> tuned -> base -> tuned, the cache mapped at each switch
(ridge mappings fitted both ways on text the base model wrote), against the same conversation
re-prefilled at every switch (:func:`kvbridge.harness.session.compare_handoff`).

    python bench/harness_session_zoo.py --turns 5 --tokens 12
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", default="base")
    ap.add_argument("--large", default="tuned")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=12, help="reply tokens per turn")
    ap.add_argument("--calibration-samples", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(a.threads)
    from kvbridge.evaluate import model_samples
    from kvbridge.fit import fit
    from kvbridge.harness.session import compare_handoff, drift_table
    from kvbridge.transfer import IdentityMapping
    from kvbridge.zoo.load import load_zoo_model

    small, tok = load_zoo_model(a.small)
    large, _ = load_zoo_model(a.large)
    calib = model_samples(small, n=a.calibration_samples, length=64, seed=7)
    t0 = time.perf_counter()
    up = fit(small, large, calib, top_k=2, stride=2, seed=0, distributed=None)
    down = fit(large, small, calib, top_k=2, stride=2, seed=0, distributed=None)
    t_fit = time.perf_counter() - t0
    lines = [
        "ROMEO: What light through yonder window breaks?",
        "\nJULIET: Ay me!",
        "\nROMEO: She speaks.",
        "\nJULIET: O Romeo, Romeo!",
        "\nROMEO: Shall I hear more?",
        "\nJULIET: 'Tis but thy name.",
    ]
    script = [((a.small, a.large)[i % 2], lines[i % len(lines)]) for i in range(a.turns)]
    models = {a.small: small, a.large: large}
    out = {}
    runs = [("fitted ridge", {(a.small, a.large): up, (a.large, a.small): down})]
    geo = [
        (m.config.num_hidden_layers, m.config.num_key_value_heads, m.config.hidden_size // m.config.num_attention_heads)
        for m in (small, large)
    ]
    if geo[0] == geo[1]:  # plain reuse only where layers, KV heads and head dim agree
        runs.append(
            ("plain reuse (identity)", {(a.small, a.large): IdentityMapping(), (a.large, a.small): IdentityMapping()})
        )
    for label, maps in runs:
        res = compare_handoff(models, tok, maps, script, max_new_tokens=a.tokens)
        out[label] = res
        print(f"\n{label}: {a.small} <-> {a.large}, {res['switches']} switches, {res['history_tokens']} tokens in all")
        print(drift_table(res))
    print(f"\n(fit both ways {t_fit:.0f} s, {a.threads} thread(s))")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
