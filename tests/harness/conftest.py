"""Fixtures of the harness tests: the zoo's trained tiny Llamas (single-threaded), a host with the
built-in plugins, and small local task files (a multiple-choice JSONL, an lm-eval task YAML)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest
import torch

from kvbridge.testing.zoo import one_torch_thread, zoo_or_skip as zoo

MC_ROWS = [
    {"question": "What colour is the sky on a clear day?", "choices": ["blue", "green", "red"], "answer": 0},
    {
        "context": "Tom has three apples.",
        "question": "How many apples does Tom have?",
        "choices": ["two", "three"],
        "answer": "three",
    },
    {"question": "Which is a fruit?", "choices": ["stone", "apple", "chair"], "answer": 1, "id": "fruit"},
]


_one_thread = pytest.fixture(scope="module", autouse=True)(one_torch_thread)


@pytest.fixture(scope="session")
def base():
    return zoo("base")


@pytest.fixture(scope="session")
def mc_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mc") / "questions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MC_ROWS), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def lm_eval_dir(tmp_path_factory):
    """A local lm-eval task folder: one multiple-choice and one generation task over a JSONL."""
    folder = tmp_path_factory.mktemp("lmeval")
    rows = [
        {
            "question": r["question"],
            "choices": r["choices"],
            "label": r["answer"] if isinstance(r["answer"], int) else r["choices"].index(r["answer"]),
            "answer": r["choices"][r["answer"]] if isinstance(r["answer"], int) else r["answer"],
        }
        for r in MC_ROWS
    ]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    common = (
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'data.jsonl'}\n"
        'test_split: test\ndoc_to_text: "Question: {{question}}\\nAnswer:"\n'
    )
    (folder / "kvb_mc.yaml").write_text(
        "task: kvb_mc\n" + common + "output_type: multiple_choice\n"
        'doc_to_choice: "{{choices}}"\ndoc_to_target: label\n'
        "metric_list:\n  - metric: acc\n",
        encoding="utf-8",
    )
    (folder / "kvb_gen.yaml").write_text(
        "task: kvb_gen\n" + common + "output_type: generate_until\n"
        'doc_to_target: " {{answer}}"\ngeneration_kwargs:\n  until: ["\\n"]\n'
        "  max_gen_toks: 6\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n",
        encoding="utf-8",
    )
    (folder / "hub_task.yaml").write_text(
        "task: kvb_hub\ndataset_path: someone/some-dataset\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: q\ndoc_to_choice: c\n"
        "doc_to_target: 0\n",
        encoding="utf-8",
    )
    return folder


@dataclass(frozen=True)
class NoisyMapping:
    """The identity plus Gaussian noise of ``scale`` x each tensor's std on content K and V."""

    scale: float
    exact: bool = False
    name: str = "noisy-identity"

    def map_content(self, state, target_spec):
        g = torch.Generator().manual_seed(0)
        noisy = lambda t: t + self.scale * t.std() * torch.randn(t.shape, generator=g)  # noqa: E731
        return replace(
            state,
            keys=tuple(noisy(k) for k in state.keys),
            values=tuple(noisy(v) for v in state.values),
            spec=target_spec,
            rope_lengths=None,
            approximate=True,
        )


@pytest.fixture(scope="session")
def noisy():
    return NoisyMapping
