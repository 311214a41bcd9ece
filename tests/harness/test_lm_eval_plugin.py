"""Plain ``lm_eval --model kvbridge`` (lm-eval's own console script, unedited) on a local task by path:
the template task's ``!function`` line imports kvbridge.harness.lm_eval_plugin, which registers the model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KVBRIDGE_DISABLE"))}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_DATASETS_CACHE=str(tmp_path / "hf-datasets"),
        PYTHONPATH=SRC + os.pathsep + env.get("PYTHONPATH", ""),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def _lm_eval() -> list[str]:
    exe = Path(sys.executable).with_name("lm_eval")
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("lm_eval")
    if not found:
        pytest.skip("lm-eval's console script lm_eval is not installed")
    return [found]


def test_template_is_written_once(tmp_path):
    from kvbridge.errors import KVBridgeError
    from kvbridge.harness.lm_eval_plugin import TAG, main, write_template

    yaml_path, data = write_template(tmp_path / "t")
    assert TAG in yaml_path.read_text() and str(data) in yaml_path.read_text()
    assert [json.loads(line)["label"] for line in data.read_text().splitlines()] == [0, 1, 1]
    with pytest.raises(KVBridgeError, match="already exists"):
        write_template(tmp_path / "t")
    assert main([str(tmp_path / "t")]) == 2 and main([]) == 2
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["kvbridge_task.jsonl", "kvbridge_task.yaml"]


def test_plain_lm_eval_cli_runs_the_kvbridge_model_on_a_local_task(tmp_path):
    from kvbridge.zoo import model_dir

    for name in ("base", "tuned"):
        if not (model_dir(name) / "model.safetensors").is_file():
            pytest.skip(f"zoo model {name!r} is not built")
    env = _env(tmp_path)
    made = subprocess.run(
        [sys.executable, "-m", "kvbridge.harness.lm_eval_plugin", str(tmp_path / "task")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    yaml_path = tmp_path / "task" / "kvbridge_task.yaml"
    out = tmp_path / "out"
    cmd = _lm_eval() + [
        "run",
        "--model",
        "kvbridge",
        "--model_args",
        "source=zoo:base,target=zoo:tuned,mapping=identity,condition=transferred",
        "--tasks",
        str(yaml_path),
        "--output_path",
        str(out),
        "--log_samples",
    ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    files = sorted(out.rglob("results_*.json"))
    assert len(files) == 1
    got = json.loads(files[0].read_text())
    assert got["config"]["model"] == "kvbridge"
    assert got["config"]["kvbridge_condition"] == "transferred" and got["config"]["kvbridge_target_layers"] == 4
    acc = got["results"]["kvbridge_task"]["acc,none"]
    samples = [
        json.loads(line) for p in out.rglob("samples_kvbridge_task_*.jsonl") for line in p.read_text().splitlines()
    ]
    assert len(samples) == 3 and acc == pytest.approx(sum(s["acc"] for s in samples) / 3)
    # one loglikelihood request per choice (3 + 2 + 3), each answered by the model
    assert sum(len(s["resps"]) for s in samples) == 8
