"""The built-in commands arrive through the same hook as a plugin's."""

from __future__ import annotations

import importlib

import click

from kvbridge import plugins as plugins_mod
from kvbridge.builtin.commands import COMMANDS
from kvbridge.cli.lazy import LazyCommand


def test_every_builtin_command_path_is_a_click_command():
    for name, path in COMMANDS.items():
        module, _, attr = path.partition(":")
        assert isinstance(getattr(importlib.import_module(module), attr), click.Command), name


def test_builtins_come_from_the_hook_as_lazy_entries():
    host = plugins_mod.make_host(entry_points=False)
    group = click.Group("kvbridge")
    host.register_commands(group)
    assert set(group.commands) == set(COMMANDS)
    assert all(isinstance(c, LazyCommand) for c in group.commands.values())
    # registering again is a no-op for the built-ins (no warning, no record error)
    host.register_commands(group)
    assert host.record("kvbridge.builtin.commands").error is None


def test_without_the_builtin_plugin_there_are_no_builtin_commands():
    host = plugins_mod.make_host(builtins=False, entry_points=False)
    group = click.Group("kvbridge")
    host.register_commands(group)
    assert not group.commands
