"""Loading a GGUF model (tokenizer + config + weights) with the metadata parsed once, against three times.

Each repeat loads the same ``.gguf`` with ``kvbridge.models.loading.load`` in two fresh processes,
alternating which goes first: one as shipped (``kvbridge.models.gguf.parsed_once``: one
``gguf.GGUFReader`` per file), one with ``parsed_once`` switched off (transformers' legacy loader
as it is: ``load_gguf_checkpoint`` for the tokenizer, the config and the weights, each parsing the
whole file). Per child: the load's CPU seconds (``time.process_time``) and wall seconds, how many
readers were built, and a digest of the loaded tensors, config and vocabulary, which must be
the same in every child. Medians; the load average beside them.

    python bench/bench_gguf_load.py [PATH.gguf] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = Path("~/.cache/kvbridge/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf").expanduser()

CHILD = r"""
import hashlib, json, sys, time
from contextlib import nullcontext
import gguf as gguf_py
import kvbridge.models.gguf as gguf_mod
from kvbridge.models.loading import load

path, once = sys.argv[1], sys.argv[2] == "once"
built = []
real = gguf_py.GGUFReader
def counting(*a, **k):
    built.append(1)
    return real(*a, **k)
gguf_py.GGUFReader = counting
if not once:
    gguf_mod.parsed_once = lambda active=True: nullcontext()
c0, w0 = time.process_time(), time.perf_counter()
m = load(path)
cpu, wall = time.process_time() - c0, time.perf_counter() - w0
h = hashlib.sha256()
for k, v in m.model.state_dict().items():
    h.update(k.encode()); h.update(v.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
h.update(json.dumps(m.config, sort_keys=True, default=str).encode())
h.update(json.dumps(sorted(m.tokenizer.get_vocab().items())).encode())
print(json.dumps({"cpu": cpu, "wall": wall, "readers": len(built), "digest": h.hexdigest()[:16]}))
"""


def child(path: Path, once: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), "once" if once else "thrice"], env=env, capture_output=True, text=True
    )
    if res.returncode:
        raise SystemExit(f"child failed ({res.returncode}): {res.stderr[-1500:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", default=str(DEFAULT))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    path = Path(args.path)
    if not path.is_file():
        raise SystemExit(f"{path}: no such GGUF file (pass the .gguf to load)")
    runs: dict = {True: [], False: []}
    load0 = os.getloadavg()
    for r in range(args.repeats):
        for once in (True, False) if r % 2 == 0 else (False, True):
            runs[once].append(child(path, once))
            print(f"  repeat {r}, {'once' if once else 'thrice'}: {runs[once][-1]}", flush=True)
    load1 = os.getloadavg()
    digests = {x["digest"] for v in runs.values() for x in v}
    print(
        f"\n# bench_gguf_load: {path.name}, {args.repeats} alternating pairs of fresh processes; load average "
        f"{load0[0]:.1f} -> {load1[0]:.1f}; every child's tensors, config and vocabulary "
        + ("identical" if len(digests) == 1 else f"DIFFER ({sorted(digests)})")
        + "\n"
    )
    print("| metadata | readers built | load CPU s (median / min) | load wall s (median / min) |")
    print("|---|---:|---:|---:|")
    for once in (False, True):
        v = runs[once]
        cpu, wall = [x["cpu"] for x in v], [x["wall"] for x in v]
        print(
            f"| {'parsed once (parsed_once)' if once else 'parsed per call (as before)'} | "
            f"{statistics.median(x['readers'] for x in v):.0f} | {statistics.median(cpu):.2f} / {min(cpu):.2f} | "
            f"{statistics.median(wall):.2f} / {min(wall):.2f} |"
        )
    ratio = statistics.median(x["cpu"] for x in runs[False]) / statistics.median(x["cpu"] for x in runs[True])
    print(f"\nCPU before / after: {ratio:.2f}x")


if __name__ == "__main__":
    main()
