from __future__ import annotations

import click
from click.testing import CliRunner

from kvbridge.cli.lazy import LazyCommand
from kvbridge.cli.main import LazyGroup


def test_a_lazy_command_loads_its_target_on_lookup():
    group = LazyGroup("g")
    group.registered = True  # no host: only what is added here
    group.add_command(LazyCommand("ver", "kvbridge.cli.main:cli"), "ver")
    assert isinstance(group.commands["ver"], LazyCommand)
    assert group.get_command(None, "ver").name == "cli"
    assert not isinstance(group.commands["ver"], LazyCommand)


def test_a_command_whose_module_is_missing_is_not_listed():
    group = LazyGroup("g")
    group.registered = True
    group.add_command(LazyCommand("gone", "kvbridge_no_such_module.cli:cmd"), "gone")

    @click.command("here")
    def here():
        click.echo("here")

    group.add_command(here)
    assert group.list_commands(None) == ["here"]
    assert group.get_command(None, "gone") is None
    assert CliRunner().invoke(group, ["here"]).output.strip() == "here"
