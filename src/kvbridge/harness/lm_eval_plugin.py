"""Plain ``lm_eval --model kvbridge``: a local task YAML imports this module, which registers the model.

lm-eval 0.4.13 finds models only in its own table (no entry-point group), but its command line
reads a task given as a YAML *path* (``--tasks /path/task.yaml`` or ``--tasks /path/folder``) with
``!function`` tags resolved before it creates the model, and ``!function a.b.c`` imports the module
``a.b``. One line in the task YAML therefore makes lm-eval's own ``lm_eval`` see the model::

    metadata:
      kvbridge: !function kvbridge.harness.lm_eval_plugin.model

(``model`` is the string ``"kvbridge"``; it lands, harmless, in the task's metadata). Then::

    lm_eval run --model kvbridge --model_args source=SRC,target=TGT,mapping=DIR --tasks /path/task.yaml

A task named through ``--include_path DIR --tasks NAME`` is read only after the model is created,
so that form still needs ``kvbridge-lm-eval`` (lm-eval's command line with this module imported).

``python -m kvbridge.harness.lm_eval_plugin DIR`` writes a template local task (``kvbridge_task.yaml``
with the line above, and ``kvbridge_task.jsonl``, three example questions) into DIR and prints the
command; copy and edit it for your own data.
"""

from __future__ import annotations

import sys
from pathlib import Path

import kvbridge.harness.lm_eval_model as _registered  # noqa: F401 - importing registers the model "kvbridge"

#: what ``!function kvbridge.harness.lm_eval_plugin.model`` resolves to: the model's registered name
model = _registered.NAME
#: the YAML line (under ``metadata:``) that loads this module
TAG = "!function kvbridge.harness.lm_eval_plugin.model"
TASK = "kvbridge_task"

TEMPLATE = """\
# A local lm-eval task for `lm_eval --model kvbridge` (written by python -m kvbridge.harness.lm_eval_plugin).
# Run it by path (lm-eval reads the YAML, and so imports kvbridge, before it creates the model):
#   lm_eval run --model kvbridge --model_args source=SRC,target=TGT,mapping=DIR --tasks {yaml}
task: {task}
dataset_path: json                      # local files only: kvbridge never downloads
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice            # or generate_until (with generation_kwargs and doc_to_target text)
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label                    # index of the right choice
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
  kvbridge: {tag}   # registers --model kvbridge
"""

ROWS = (
    '{"question": "What colour is the sky on a clear day?", "choices": ["blue", "green", "red"], "label": 0}\n'
    '{"question": "Tom has three apples. How many apples does Tom have?", "choices": ["two", "three"], "label": 1}\n'
    '{"question": "Which is a fruit?", "choices": ["stone", "apple", "chair"], "label": 1}\n'
)


def write_template(folder, task: str = TASK) -> tuple[Path, Path]:
    """Write ``TASK.yaml`` and ``TASK.jsonl`` into ``folder`` (each atomically: a temporary file, then
    renamed); an existing file is never overwritten. Returns (yaml, data) paths."""
    from kvbridge.artifacts import write_file_atomic
    from kvbridge.harness.protocol import HarnessError

    folder = Path(folder).expanduser().resolve()
    yaml_path, data_path = folder / f"{task}.yaml", folder / f"{task}.jsonl"
    for p in (yaml_path, data_path):
        if p.exists():
            raise HarnessError(f"{p} already exists", "pass another folder, or remove the file")
    folder.mkdir(parents=True, exist_ok=True)
    write_file_atomic(data_path, ROWS)
    write_file_atomic(yaml_path, TEMPLATE.format(task=task, data=data_path, yaml=yaml_path, tag=TAG))
    return yaml_path, data_path


def main(argv=None) -> int:
    """``python -m kvbridge.harness.lm_eval_plugin DIR``: write the template task into DIR."""
    from kvbridge.errors import KVBridgeError

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print(
            "usage: python -m kvbridge.harness.lm_eval_plugin DIR   (writes DIR/kvbridge_task.yaml and "
            "DIR/kvbridge_task.jsonl)",
            file=sys.stderr,
        )
        return 2
    try:
        yaml_path, data_path = write_template(args[0])
    except KVBridgeError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"error: cannot write the template into {args[0]} ({exc.strerror or exc}) (fix: pass a writable folder)",
            file=sys.stderr,
        )
        return 2
    print(
        f"wrote {yaml_path} and {data_path}\nrun: lm_eval run --model kvbridge "
        f"--model_args source=SRC,target=TGT,mapping=DIR --tasks {yaml_path}"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through a subprocess in the tests
    raise SystemExit(main())
