"""Campaign, class "code shipped with a model": a model or tokenizer folder whose ``auto_map`` points at
its own Python file is refused by every command that loads a model or a tokenizer, with ``y`` on stdin:
one line naming the ``auto_map`` entry, exit 2, no prompt, and the folder's code never runs."""

from __future__ import annotations

import json
import shutil

import pytest

EVIL_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("the model folder's code ran")
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


class EvilConfig(LlamaConfig):
    model_type = "evilllama"


class EvilModel(LlamaForCausalLM):
    config_class = EvilConfig


class EvilTok(PreTrainedTokenizerFast):
    pass
"""

#: where the code pointer sits: the model's config (known and unknown model_type) or the tokenizer's
KINDS = ("model-known-type", "model-unknown-type", "tokenizer")


@pytest.fixture(scope="module")
def evil(world, tmp_path_factory):
    """``{kind: folder}``: copies of the world's source model whose JSON points at ``evil.py``."""
    root = tmp_path_factory.mktemp("remote-code")
    marker = root / "MARKER"
    out = {}
    for kind in KINDS:
        folder = root / kind
        shutil.copytree(world.src, folder)
        (folder / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
        if kind == "tokenizer":
            tc = json.loads((folder / "tokenizer_config.json").read_text())
            tc.update(auto_map={"AutoTokenizer": ["evil.EvilTok", "evil.EvilTok"]}, tokenizer_class="EvilTok")
            (folder / "tokenizer_config.json").write_text(json.dumps(tc))
        else:
            cfg = json.loads((folder / "config.json").read_text())
            cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
            if kind == "model-unknown-type":
                cfg["model_type"] = "evilllama"
            (folder / "config.json").write_text(json.dumps(cfg))
        out[kind] = folder
    out["marker"] = marker
    return out


def _commands(world, m, tmp):
    """Every command that loads a model or a tokenizer, with ``m`` as the model (or tokenizer)."""
    return {
        "fit-source": [
            "fit",
            m,
            world.tgt,
            "--corpus",
            world.corpus,
            "--out",
            tmp / "map1",
            "--seq-len",
            32,
            "--tokens",
            256,
            "--top-k",
            1,
            "--quiet",
        ],
        "fit-target": [
            "fit",
            world.src,
            m,
            "--corpus",
            world.corpus,
            "--out",
            tmp / "map2",
            "--seq-len",
            32,
            "--tokens",
            256,
            "--top-k",
            1,
            "--quiet",
        ],
        "transfer": [
            "transfer",
            m,
            world.tgt,
            "--mapping",
            world.mapping,
            "--prompt",
            world.prompt,
            "--accept-fingerprint-mismatch",
        ],
        "eval": ["eval", m, m, "--mapping", "identity", "--corpus", world.corpus],
        "pack-save": ["pack", "save", m, "--guide", world.guide, "--out", tmp / "pack"],
        "pack-verify": ["pack", "verify", world.pack, m, "--force"],
        "split": ["split", m, "--guide", world.guide, "--live", world.prompt],
        "diverge": ["diverge", m, "--guide", world.guide, "--prompt", world.prompt, "--greedy"],
        "ablate": ["ablate", m, "--guide", world.guide, "--prompt", world.prompt],
        "graft-run": ["graft", "run", m, "--context", world.guide, "--chunk", world.guide, "--prompt", world.prompt],
        "graft-eval": ["graft", "eval", m, "--corpus", world.corpus],
        "tokenizer-option": [
            "diverge",
            world.src,
            "--tokenizer",
            m,
            "--guide",
            world.guide,
            "--prompt",
            world.prompt,
            "--greedy",
        ],
    }


COMMANDS = (
    "fit-source",
    "fit-target",
    "transfer",
    "eval",
    "pack-save",
    "pack-verify",
    "split",
    "diverge",
    "ablate",
    "graft-run",
    "graft-eval",
    "tokenizer-option",
)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cmd", COMMANDS)
def test_model_folder_code_never_runs(world, evil, tmp_path, c, cmd, kind):
    evil["marker"].unlink(missing_ok=True)
    args = _commands(world, evil[kind], tmp_path)[cmd]
    res = c.cli(args, input="y\ny\ny\n")
    assert not evil["marker"].exists(), f"{cmd}: the model folder's code ran"
    assert "custom code" not in res.output and "[y/N]" not in res.output, res.output
    line = c.error(res, "auto_map")
    assert "evil." in line, line  # names the entry
    assert not (tmp_path / "pack").exists() and not (tmp_path / "map1").exists()


def test_model_folder_code_never_runs_in_a_real_process(world, evil, tmp_path):
    """A real process with ``y`` on its stdin: no prompt, exit 2, one line, no marker."""
    import os
    import subprocess
    import sys

    evil["marker"].unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HF_HUB_OFFLINE": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvbridge",
            "pack",
            "save",
            str(evil["tokenizer"]),
            "--guide",
            world.guide,
            "--out",
            str(tmp_path / "p"),
        ],
        input="y\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert not evil["marker"].exists()
    assert res.returncode == 2 and res.stdout == "" and res.stderr.count("\n") == 1, (res.stdout, res.stderr)
    assert "auto_map" in res.stderr and "AutoTokenizer" in res.stderr, res.stderr
