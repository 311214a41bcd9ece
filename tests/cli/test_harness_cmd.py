"""``kvbridge harness`` end to end on the zoo (base -> tuned with a mapping fitted here), its report
files, and its one-line refusals (exit 2): unknown task, code execution not allowed, a hub-only
lm-eval task, a mapping fitted for another pair."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner


def _zoo_or_skip():
    from kvbridge.zoo import model_dir

    for name in ("base", "tuned", "stranger"):
        if not (model_dir(name) / "model.safetensors").is_file():
            pytest.skip(f"zoo model {name!r} is not built")


def run(*args):
    from kvbridge.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def mapping(tmp_path_factory):
    """A ridge mapping zoo:base -> zoo:tuned fitted on text the base model wrote."""
    _zoo_or_skip()
    import torch

    from kvbridge.evaluate import model_samples
    from kvbridge.models import load

    torch.set_num_threads(1)
    loaded = load("zoo:base")
    model, tok = loaded.model, loaded.tokenizer
    folder = tmp_path_factory.mktemp("harness-cli")
    ids = model_samples(model, n=8, length=100, seed=3)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(tok.decode(row[1:]) for row in ids), encoding="utf-8")
    out = folder / "map"
    res = run(
        "fit",
        "zoo:base",
        "zoo:tuned",
        "--corpus",
        corpus,
        "--out",
        out,
        "--seq-len",
        32,
        "--tokens",
        512,
        "--stride",
        2,
        "--top-k",
        1,
        "--batch-size",
        8,
    )
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def mc_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("mc") / "q.jsonl"
    path.write_text(
        '{"question": "Which is a fruit?", "choices": ["stone", "apple"], "answer": 1}\n'
        '{"question": "Who is the king?", "choices": ["Richard", "a spoon"], "answer": 0}\n'
    )
    return path


def test_fitted_pair_json_and_report(mapping, mc_jsonl, tmp_path):
    res = run(
        "harness",
        "zoo:base",
        "zoo:tuned",
        "--mapping",
        mapping,
        "--tasks",
        "recall,mc",
        "-o",
        "recall.lengths=48",
        "-o",
        "recall.positions=0.5",
        "-o",
        "recall.n=2",
        "-o",
        "recall.max_new_tokens=3",
        "-o",
        f"mc.path={mc_jsonl}",
        "--recompute-layers",
        "all",
        "--bootstrap",
        "50",
        "--threads",
        "1",
        "--json",
        "--report",
        tmp_path / "rep",
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["conditions"] == ["target", "source", "transferred", "plain", "no_context", "transferred+layers:all"]
    assert data["tasks"]["mc"]["n"] == 2 and data["tasks"]["recall"]["n"] == 2 and data["overall"]["n"] == 4
    for key in ("retention", "floor_normalised_retention", "gap_closed", "paired"):
        assert key in data["tasks"]["mc"]
    for recs in data["items"].values():  # all layers recomputed: the target's own cache, the target's answers
        for rec in recs:
            assert rec["answers"]["transferred+layers:all"] == rec["answers"]["target"]
    for name in ("harness.json", "summary.md", "accuracy.png"):
        assert (tmp_path / "rep" / name).is_file()
    assert "| task | n | target |" in (tmp_path / "rep" / "summary.md").read_text()
    assert not (tmp_path / "rep.partial.jsonl").exists()


def test_table_output(mapping):
    res = run(
        "harness",
        "zoo:base",
        "zoo:tuned",
        "--mapping",
        mapping,
        "--tasks",
        "recall",
        "-o",
        "recall.lengths=40",
        "-o",
        "recall.positions=0",
        "-o",
        "recall.n=1",
        "--conditions",
        "target,source,transferred",
        "--bootstrap",
        "0",
        "--threads",
        "1",
    )
    assert res.exit_code == 0, res.output
    assert "retention" in res.stdout and "gap closed" in res.stdout and "transferred-target" in res.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tasks", "recal"], "unknown task 'recal'"),
        (["--tasks", "humaneval"], "code execution is not allowed"),
        (["--tasks", "recall", "-o", "recall.bogus=1"], "has no option 'bogus'"),
        ([], "no tasks given"),
        (["--tasks", "mc", "-o", "mc.path=/no/such.jsonl"], "not found"),
    ],
)
def test_refusals_before_loading(args, message):
    res = run("harness", "zoo:base", "zoo:tuned", "--mapping", "identity", *args)
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_hub_only_lm_eval_task_refused(tmp_path):
    pytest.importorskip("lm_eval")
    task = tmp_path / "hub.yaml"
    task.write_text("task: kvb_hub2\ndataset_path: org/dataset\noutput_type: multiple_choice\n")
    res = run("harness", "zoo:base", "zoo:tuned", "--mapping", "identity", "--lm-eval-task", task)
    assert res.exit_code == 2 and "Hugging Face hub" in res.output and "dataset_path: json" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_mapping_for_another_pair_refused(mapping):
    res = run("harness", "zoo:base", "zoo:stranger", "--mapping", mapping, "--tasks", "recall", "-o", "recall.n=1")
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_harness_is_listed_and_light():
    import subprocess
    import sys

    code = (
        "import sys; import kvbridge.cli.harness_cmd; assert 'torch' not in sys.modules; "
        "assert 'lm_eval' not in sys.modules; from kvbridge.builtin.commands import COMMANDS; assert 'harness' in COMMANDS"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_local_lm_eval_task(mapping, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    (tmp_path / "d.jsonl").write_text(
        '{"q": "Which is a fruit?", "c": ["stone", "apple"], "y": 1}\n'
        '{"q": "Who is the king?", "c": ["Richard", "a spoon"], "y": 0}\n'
    )
    (tmp_path / "t.yaml").write_text(
        f"task: kvb_cli_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'd.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "Question: {{q}}\\nAnswer:"\ndoc_to_choice: "{{c}}"\n'
        "doc_to_target: y\nmetric_list:\n  - metric: acc\n"
    )
    res = run(
        "harness",
        "zoo:base",
        "zoo:tuned",
        "--mapping",
        mapping,
        "--lm-eval-task",
        tmp_path / "t.yaml",
        "-o",
        "lm-eval:kvb_cli_mc.num_fewshot=0",
        "--bootstrap",
        "20",
        "--threads",
        "1",
        "--json",
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (
        data["tasks"]["lm-eval:kvb_cli_mc"]["n"] == 2
        and "transferred" in data["tasks"]["lm-eval:kvb_cli_mc"]["conditions"]
    )
