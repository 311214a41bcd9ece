"""``kvbridge models``: short names and schemes, torch-free."""

from __future__ import annotations

import json
import subprocess
import sys


def test_models_lists_short_names_and_zoo(tmp_path):
    code = ("import sys; from kvbridge.cli.main import main\n"
            "try: main(['models', '--json'])\n"
            "except SystemExit: pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH')")
    env = {"KVBRIDGE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    import os

    env.update({k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "KVBRIDGE_SHARED"))})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    rows = json.loads(out[: out.rindex("]") + 1])
    names = {r["name"]: r for r in rows}
    assert names["smollm2"]["cached"] is False and str(tmp_path) in names["smollm2"]["path"]
    assert names["zoo:base"]["cached"] is True
    assert out.strip().endswith("NOTORCH")
