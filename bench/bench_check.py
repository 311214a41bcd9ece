"""`kvbridge check` on two local configs vs `python -c "import torch"` (target: under 0.5 s).

Each command runs REPEATS times in a fresh process, alternating, and the median (and min) wall
time is reported with the ratio to the torch import. The configs are the real ones in
../shared/fixtures/configs (or $KVBRIDGE_SHARED/fixtures/configs); without them the rows that
need them are skipped and the manifest-name rows still run. Also asserts that `check` left
torch unimported.

    python bench/bench_check.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _timing import time_commands

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KVBRIDGE_SHARED", REPO.parent / "shared"))
CONFIGS = SHARED / "fixtures" / "configs"
BIN = Path(sys.executable).parent
KVB = [str(BIN / "kvbridge")] if (BIN / "kvbridge").exists() else [sys.executable, "-m", "kvbridge"]


def commands() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if CONFIGS.is_dir():
        a, b = CONFIGS / "Qwen__Qwen2.5-0.5B", CONFIGS / "meta-llama__Llama-3.2-1B"
        out["kvbridge check <Qwen2.5-0.5B dir> <Llama-3.2-1B dir>"] = [*KVB, "check", str(a), str(b)]
        out["kvbridge check <dir> <dir> --json"] = [*KVB, "check", str(a), str(b), "--json"]
    out["kvbridge check Qwen/Qwen2.5-0.5B Qwen/Qwen2.5-1.5B (manifests)"] = [
        *KVB,
        "check",
        "Qwen/Qwen2.5-0.5B",
        "Qwen/Qwen2.5-1.5B",
    ]
    out["kvbridge describe google/gemma-3-1b-it"] = [*KVB, "describe", "google/gemma-3-1b-it"]
    out['python -c "import torch"'] = [sys.executable, "-c", "import torch"]
    return out


def torch_free() -> bool:
    if not CONFIGS.is_dir():
        return True
    code = (
        "import sys; from kvbridge.cli.main import main\n"
        f"try: main(['check', {str(CONFIGS / 'Qwen__Qwen2.5-0.5B')!r}, {str(CONFIGS / 'meta-llama__Llama-3.2-1B')!r}])\n"
        "except SystemExit: pass\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return out.stdout.strip().endswith("False")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument(
        "--no-bytecode",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE as set (every run recompiles every module)",
    )
    args = parser.parse_args()
    cmds = commands()
    env = dict(os.environ)
    env.setdefault("HF_HUB_CACHE", tempfile.mkdtemp(prefix="kvb-bench-hf-"))  # no accidental cache hits
    if not args.no_bytecode:  # as an installed package runs: compiled once, then cached bytecode
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="kvb-bench-pyc-")  # not into the repo
    times, cpu = time_commands(cmds, args.repeats, env=env, ok=(0, 1), warm=True)
    base = statistics.median(times['python -c "import torch"'])
    print(f"| command | median wall s ({args.repeats} runs) | min wall s | median CPU s | vs import torch |")
    print("|---|---:|---:|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| `{name}` | {med:.3f} | {min(ts):.3f} | {statistics.median(cpu[name]):.3f} | {med / base:.2f}x |")
    print()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"torch imported by check: {'no' if torch_free() else 'YES'}; python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load average {load:.1f}, bytecode cache {'off' if args.no_bytecode else 'on'}"
    )


if __name__ == "__main__":
    main()
