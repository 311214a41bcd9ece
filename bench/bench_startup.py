"""CLI start-up: `kvbridge --help` and `kvbridge plugins` vs `python -c "import torch"`.

Each command runs REPEATS times in a fresh process, alternating, and the median wall time is
reported with the ratio to the torch import (side by side, one run).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from _timing import time_commands

REPEATS = 7
BIN = Path(sys.executable).parent
COMMANDS = {
    "kvbridge --help": [str(BIN / "kvbridge"), "--help"],
    "kvbridge plugins": [str(BIN / "kvbridge"), "plugins"],
    'python -c "import torch"': [sys.executable, "-c", "import torch"],
}


def main() -> None:
    times, _ = time_commands(COMMANDS, REPEATS)
    base = statistics.median(times['python -c "import torch"'])
    print(f"| command | median s ({REPEATS} runs) | vs import torch |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| `{name}` | {med:.3f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
