"""Transfer against the target's own prefill on the real pair (Qwen2.5-Coder 0.5B -> 1.5B), by length.

    flock /tmp/kvbridge-heavy.lock python bench/bench_pair_speed.py --mapping /work/pair-runs/run1/map-k4-a0.01 \
        [--lengths 512,2048,8192,32768] [--prefill-lengths 512,2048,8192] [--repeats 3]

**transfer** = what a transfer costs once the source holds the cache: strip the source's RoPE, map
(the fitted mapping, top-k 4), re-apply the 1.5B's RoPE, inject into the 1.5B's cache layout
(``kvbridge.transfer.transfer`` + the adapter's ``inject``), on a source state of the 0.5B's
geometry (24 x 2 x 64) with random values (the cost does not depend on them). **prefill** = the
1.5B (dequantized float32, sdpa attention) running the same number of tokens in one forward
(``use_cache=True``, ``logits_to_keep=1``), random token ids. Medians of ``--repeats`` (prefill:
one run per length; it is the slow side). Peak memory: the process's resident high-water mark
after each step (steps run in increasing cost: every transfer first, then the prefills), and the
bytes of the transferred cache itself; on Linux also each step's own peak (``VmHWM``, reset through
``/proc/self/clear_refs`` before the step), so a prefill's peak is not hidden by a transfer's.

The prefill logs each decoder layer's time (stderr) and, after ``--probe-layers`` layers, projects
the whole forward; where the projection exceeds ``--prefill-budget-s`` the forward is stopped and the
row says "not measured" with the projection (the probe the 32,768-token prefill needs on 2 cores).

**Layerwise** (``--layerwise DIR``, no ``--mapping``): one prefill measured a decoder layer at a
time, resumable across sessions, so a prefill too long for one sitting is measured, not projected::

    flock /tmp/kvbridge-heavy.lock python bench/bench_pair_speed.py --layerwise DIR \\
        --prefill-model target --length 32768 --threads 2 [--max-seconds 2400] [--verify]

The layers run with the arguments the model's own forward builds for them, so the result is bitwise
the one forward's (``bench/_layerwise.py`` says how, and what ``DIR`` holds). Rerun the same command
to resume after the last finished layer; a folder made for another model, length, seed, dtype or
thread count is refused. ``--max-seconds`` stops between layers; ``--prefill-model source`` measures
the 0.5B; ``--model REF`` any other model; ``--seed`` defaults to the length, so the ids are the
one-forward rows' ids. Once complete it prints the measured total (embedding + mask/rotary + the
layers + norm and last logits, each stated) and the peak; ``--verify`` then runs the one forward
on the same ids and says its time and whether logits and every layer's K/V are bitwise equal.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _layerwise import reset_step_peak, rss_gib, step_peak_gib  # noqa: E402


class OverBudget(Exception):
    """Raised from a layer hook when the projected prefill time exceeds the budget."""


def layer_clock(layers, *, probe: int, budget_s: float | None):
    """Forward hooks on ``layers`` logging each one's time; stop once the projection passes ``budget_s``."""
    state = {"t0": None, "last": None, "done": 0, "projected_s": None, "per_layer_s": []}

    def pre(_m, _a):
        now = time.perf_counter()
        if state["t0"] is None:
            state["t0"] = now
        state["last"] = now

    def post(_m, _a, _o):
        now = time.perf_counter()
        state["per_layer_s"].append(now - state["last"])
        state["done"] += 1
        elapsed = now - state["t0"]
        state["projected_s"] = elapsed / state["done"] * len(layers)
        print(
            f"  layer {state['done']}/{len(layers)}: {state['per_layer_s'][-1]:.1f} s (projected forward "
            f"{state['projected_s']:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        if budget_s and state["done"] == probe and state["projected_s"] > budget_s:
            raise OverBudget

    handles = [m.register_forward_pre_hook(pre) for m in layers] + [m.register_forward_hook(post) for m in layers]
    return state, handles


#: the pair's models, by role
MODELS = {"source": "qwen2.5-coder-0.5b", "target": "qwen2.5-coder-1.5b"}


def token_ids(length: int, seed: int, vocab: int | None):
    """The random prompt: ids in [0, 30000) (the vocabulary's size where smaller), seeded; the
    one-forward rows use ``seed = length``."""
    import torch

    high = min(30000, vocab) if vocab else 30000
    return torch.randint(0, high, (1, length), generator=torch.Generator().manual_seed(seed))


def layerwise_main(args, argv) -> int:
    """``--layerwise DIR``: run or resume one layer-by-layer prefill, then report it."""
    started = time.perf_counter()
    if not args.length or args.length < 1:
        raise SystemExit("--layerwise needs --length N (tokens, >= 1)")
    import torch

    from _layerwise import Refused, check_folder, make_meta, report, run_layerwise, verify

    from kvbridge.models import load
    from kvbridge.models.fingerprint import config_fingerprint
    from kvbridge.models.resolve import resolve

    if args.threads:
        torch.set_num_threads(args.threads)
    ref = args.model or MODELS[args.prefill_model]
    seed = args.length if args.seed is None else args.seed
    resolved = resolve(ref)
    ids = token_ids(args.length, seed, resolved.config.get("vocab_size"))
    meta = make_meta(
        model=ref,
        weights=resolved.weights_digest(),
        config=config_fingerprint(resolved.config),
        ids=ids,
        dtype=args.dtype,
        threads=torch.get_num_threads(),
        seed=seed,
    )
    command = ["bench/bench_pair_speed.py", *(sys.argv[1:] if argv is None else argv)]
    try:
        record = check_folder(args.layerwise, meta)  # refused before the model is loaded
        if record is None or not record.get("complete") or args.verify:
            t0 = time.perf_counter()
            model = load(ref, dtype=args.dtype, tokenizer=False).model.eval()
            print(
                f"loaded {ref} in {time.perf_counter() - t0:.0f} s, peak RSS {rss_gib():.2f} GiB, "
                f"{torch.get_num_threads()} threads",
                file=sys.stderr,
                flush=True,
            )
            record = run_layerwise(
                model, ids, args.layerwise, meta, max_seconds=args.max_seconds, started=started, command=command
            )
    except Refused as exc:
        raise SystemExit(str(exc)) from None
    print(report(record))
    result = {"record": record}
    if args.verify and record.get("complete"):
        result["verify"] = check = verify(model, ids, args.layerwise)
        total = record["summary"]["total_s"]
        print(
            f"one forward on the same ids: {check['forward_wall_s']:.2f} s, CPU {check['forward_cpu_s']:.2f} s "
            f"(layerwise total / one forward: {total / check['forward_wall_s']:.3f} wall, "
            f"{record['summary']['total_cpu_s'] / check['forward_cpu_s']:.3f} CPU), peak RSS {check['forward_peak_rss_gib'] or 0:.2f} GiB; "
            f"logits bitwise equal: {check['logits_equal']}; K/V bitwise equal over {check['kv_layers_compared']} "
            f"layers: {check['kv_equal']}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mapping", type=Path, default=None, help="a kvbridge fit folder for 0.5B -> 1.5B")
    ap.add_argument("--lengths", default="512,2048,8192,32768")
    ap.add_argument("--prefill-lengths", default="512,2048,8192")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--probe-layers", type=int, default=2, help="layers timed before the prefill is projected")
    ap.add_argument(
        "--prefill-budget-s",
        type=float,
        default=None,
        help="stop a prefill whose projection after --probe-layers layers exceeds this (not measured)",
    )
    lw = ap.add_argument_group("layerwise prefill (resumable; no transfer, no --mapping)")
    lw.add_argument(
        "--layerwise",
        type=Path,
        default=None,
        metavar="DIR",
        help="run one prefill a decoder layer at a time, recording each layer into DIR; rerun to resume",
    )
    lw.add_argument("--prefill-model", choices=sorted(MODELS), default="target", help="which model of the pair")
    lw.add_argument("--model", default=None, help="any model reference instead of the pair's (e.g. zoo:base)")
    lw.add_argument("--length", type=int, default=None, help="tokens of the layerwise prefill (required with it)")
    lw.add_argument("--seed", type=int, default=None, help="seed of the random token ids (default: the length)")
    lw.add_argument("--dtype", default="float32")
    lw.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop between layers rather than pass this many seconds since the process started (load included)",
    )
    lw.add_argument(
        "--verify",
        action="store_true",
        help="once complete, run the one forward on the same ids: its time, and whether it is bitwise the same",
    )
    args = ap.parse_args(argv)
    if args.layerwise is not None:
        return layerwise_main(args, argv)
    if args.mapping is None:
        ap.error("--mapping is required (a kvbridge fit folder for 0.5B -> 1.5B), unless --layerwise DIR")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_fit import random_state

    from kvbridge.fit.artifact import load_mapping
    from kvbridge.models import load
    from kvbridge.plugins import get_host
    from kvbridge.transfer import transfer

    host = get_host()
    mapping = load_mapping(args.mapping, host=host)
    t0 = time.perf_counter()
    big = load("qwen2.5-coder-1.5b", dtype="float32", host=host)
    model = big.model.eval()
    load_s = time.perf_counter() - t0
    tad = host.adapter_of(model)
    print(
        f"loaded the 1.5B in {load_s:.0f} s, peak RSS {rss_gib():.2f} GiB, {torch.get_num_threads()} threads",
        file=sys.stderr,
        flush=True,
    )
    rows = {}
    with torch.no_grad():
        for n in [int(x) for x in args.lengths.split(",") if x]:
            state = random_state(mapping.source_spec, n)
            reset_step_peak()
            times = []
            for _ in range(args.repeats):
                moved = cache = None  # the previous repeat's cache is not part of this one's peak
                t1 = time.perf_counter()
                moved = transfer(state, mapping, host=host)
                cache = tad.inject(moved, model)
                times.append(time.perf_counter() - t1)
            nbytes = sum(t.numel() * t.element_size() for t in (*moved.keys, *moved.values))
            rows[n] = {
                "tokens": n,
                "transfer_s": statistics.median(times),
                "cache_mib": nbytes / 2**20,
                "peak_rss_gib_after_transfer": rss_gib(),
                "step_peak_rss_gib_transfer": step_peak_gib(),
            }
            del state, moved, cache
            print(f"transfer {n}: {rows[n]['transfer_s'] * 1e3:.0f} ms", file=sys.stderr, flush=True)
        for n in [int(x) for x in args.prefill_lengths.split(",") if x]:
            ids = torch.randint(0, 30000, (1, n), generator=torch.Generator().manual_seed(n))
            row = rows.setdefault(n, {"tokens": n})
            clock, handles = layer_clock(model.model.layers, probe=args.probe_layers, budget_s=args.prefill_budget_s)
            reset_step_peak()
            t1 = time.perf_counter()
            try:
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                row["prefill_s"] = time.perf_counter() - t1
                del out
            except OverBudget:
                row["prefill_projected_s"] = clock["projected_s"]
                print(
                    f"prefill {n}: stopped after {args.probe_layers} layers, projected {clock['projected_s']:.0f} s "
                    f"> budget {args.prefill_budget_s:.0f} s: not measured",
                    file=sys.stderr,
                    flush=True,
                )
            finally:
                for h in handles:
                    h.remove()
            row["prefill_layer_s"] = clock["per_layer_s"]
            row["peak_rss_gib_after_prefill"] = rss_gib()
            row["step_peak_rss_gib_prefill"] = step_peak_gib()
            if "prefill_s" in row:
                print(f"prefill {n}: {row['prefill_s']:.1f} s", file=sys.stderr, flush=True)
    result = {
        "argv": sys.argv[1:],
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "load_s": load_s,
        "loadavg": os.getloadavg(),
        "rows": [rows[k] for k in sorted(rows)],
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(
        "| tokens | 1.5B prefill | transfer (strip + map + re-apply + inject) | prefill / transfer | "
        "transferred cache | peak RSS after transfer / prefill | own peak of transfer / prefill |"
    )
    print("|---:|---:|---:|---:|---:|---|---|")

    def gib(x):
        return "n/a" if x is None else f"{x:.2f}"

    for r in result["rows"]:
        pre, tr = r.get("prefill_s"), r.get("transfer_s")
        ratio = f"{pre / tr:.0f}x" if pre and tr else "not measured"
        pre_txt = (
            f"{pre:.1f} s"
            if pre
            else f"not measured (projected {r['prefill_projected_s']:.0f} s)"
            if r.get("prefill_projected_s")
            else "not measured"
        )
        cache = f"{r['cache_mib']:.0f} MiB" if r.get("cache_mib") else "n/a"
        print(
            f"| {r['tokens']:,} | {pre_txt} | {f'{tr * 1e3:,.0f} ms' if tr else 'not measured'} | {ratio} | "
            f"{cache} | "
            f"{gib(r.get('peak_rss_gib_after_transfer'))} / {gib(r.get('peak_rss_gib_after_prefill'))} GiB | "
            f"{gib(r.get('step_peak_rss_gib_transfer'))} / {gib(r.get('step_peak_rss_gib_prefill'))} GiB |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
