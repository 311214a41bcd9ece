"""Tasks are plugins: the built-ins register through the host, a third-party task is found by name,
a class missing a member is refused naming it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvbridge.harness.protocol import GenItem


@dataclass(frozen=True)
class EchoOptions:
    n: int = 2


class EchoTask:
    """Repeat a word from the context."""

    name = "echo"
    Options = EchoOptions
    no_context = True

    def items(self, options, tokenizer):
        return [
            GenItem(id=str(i), context=f"The word is moon{i}.\n", query="The word is", answer=f"moon{i}")
            for i in range(options.n)
        ]

    def score(self, item, completion):
        return float(completion.strip().startswith(item.answer))

    def chance(self, item):
        return 0.0


class Broken:
    name = "broken"
    Options = EchoOptions

    def items(self, options, tokenizer):
        return []


class Plugin:
    from kvbridge.hookspecs import hookimpl

    @staticmethod
    @hookimpl
    def kvbridge_register_tasks(register):
        register(EchoTask)
        register(Broken)


def test_builtins_and_a_plugin_task():
    from kvbridge.harness.run import load_tasks
    from kvbridge.plugins import make_host

    host = make_host(entry_points=False, extra=[("echo-plugin", Plugin)])
    names = host.registry("task").names()
    assert {"recall", "mc", "humaneval", "echo"} <= set(names) and "broken" not in names
    record = next(r for r in host.records if r.name == "echo-plugin")
    assert "missing member 'score'" in record.error
    tasks = load_tasks(["echo", "recall"], {"echo": {"n": "3"}}, host=host)
    assert tasks[0].options.n == 3 and tasks[0].plugin == "echo-plugin" and tasks[1].plugin == "kvbridge.builtin.tasks"


def test_bad_task_names_and_options_are_one_line():
    from kvbridge.errors import KVBridgeError
    from kvbridge.harness.run import load_tasks, parse_task_options
    from kvbridge.plugins import make_host

    host = make_host(entry_points=False)
    with pytest.raises(KVBridgeError, match="unknown task 'recal'.*did you mean recall"):
        load_tasks(["recal"], host=host)
    with pytest.raises(KVBridgeError, match="has no option 'lenghts'.*did you mean lengths"):
        load_tasks(["recall"], {"recall": {"lenghts": "1"}}, host=host)
    with pytest.raises(KVBridgeError, match="not in --tasks"):
        load_tasks(["recall"], {"mc": {"path": "x"}}, host=host)
    with pytest.raises(KVBridgeError, match="TASK.key=value"):
        parse_task_options(["lengths=4"])
    assert parse_task_options(["recall.lengths=256,1024", "mc.path=a=b"]) == {
        "recall": {"lengths": "256,1024"},
        "mc": {"path": "a=b"},
    }
