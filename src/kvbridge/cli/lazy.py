"""A command known by name and ``"module:attr"`` path, imported when first used.

The built-in commands register as these (:mod:`kvbridge.builtin.commands`), and a plugin may too:
``cli.add_command(LazyCommand("hello", "my_plugin.cli:hello", "Say hi."))`` in its
``kvbridge_register_commands``. The group imports the module when the command is invoked or listed by ``--help`` (command
modules import no torch or transformers at module level).
"""

from __future__ import annotations

import importlib.util

import click

from kvbridge.plugin_types import load_object


class LazyCommand(click.Command):
    """Stands in for the click command at ``path`` until the group resolves it (:meth:`load`)."""

    def __init__(self, name: str, path: str, short_help: str | None = None) -> None:
        super().__init__(name, short_help=short_help)
        self.path = path

    def available(self) -> bool:
        """Whether the command's module can be found (an optional extra may be missing)."""
        try:
            return importlib.util.find_spec(self.path.partition(":")[0]) is not None
        except (ImportError, ValueError):
            return False

    def load(self) -> click.Command:
        return load_object(self.path)
