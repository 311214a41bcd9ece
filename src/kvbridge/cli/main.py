"""Root ``kvbridge`` command group.

Commands are listed here as ``name -> "module:attr"`` and imported only when invoked (or
when ``--help`` lists them, which reads only their short help), so start-up imports neither
torch nor transformers. Plugins add commands through ``kvbridge_register_commands``.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from kvbridge import __version__
from kvbridge.errors import KVBridgeError

#: built-in commands, imported on use
COMMANDS = {
    "plugins": "kvbridge.cli.plugins_cmd:plugins",
    "describe": "kvbridge.cli.describe_cmd:describe",
    "models": "kvbridge.cli.models_cmd:models",
    "check": "kvbridge.cli.check_cmd:check",
    "split": "kvbridge.cli.split_cmd:split",
    "pack": "kvbridge.cli.pack_cmd:pack",
    "diverge": "kvbridge.cli.diverge_cmd:diverge",
    "ablate": "kvbridge.cli.ablate_cmd:ablate",
    "demo": "kvbridge.cli.demo_cmd:demo",
    "zoo": "kvbridge.cli.zoo_cmd:zoo",
    "fit": "kvbridge.cli.fit_cmd:fit",
    "transfer": "kvbridge.cli.transfer_cmd:transfer",
    "eval": "kvbridge.cli.eval_cmd:eval_cmd",
    "conformance": "kvbridge.cli.conformance_cmd:conformance",
    "graft": "kvbridge.cli.graft_cmd:graft",
}


def _available(path: str) -> bool:
    module = path.partition(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


class LazyGroup(click.Group):
    """A group whose built-in commands import on first use."""

    def list_commands(self, ctx):
        names = {n for n, p in COMMANDS.items() if _available(p)}
        names.update(super().list_commands(ctx))
        return sorted(names)

    def get_command(self, ctx, name):
        if name in COMMANDS and name not in self.commands and _available(COMMANDS[name]):
            module, _, attr = COMMANDS[name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KVBridgeError as exc:
            if os.environ.get("KVBRIDGE_DEBUG"):
                raise
            click.echo(f"error: {exc.one_line()}", err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvbridge")
def cli() -> None:
    """kvbridge: move attention KV caches between transformer language models.

    Exact where exactness is possible (same-model identity transfer, prefix packs),
    measured where it is not (fitted mappings, quality reports with controls).
    Set KVBRIDGE_DEBUG=1 to see tracebacks.
    """


_PLUGIN_COMMANDS_ADDED = False


def build_cli() -> click.Group:
    """The root group with plugin commands added (once)."""
    global _PLUGIN_COMMANDS_ADDED
    if not _PLUGIN_COMMANDS_ADDED:
        _PLUGIN_COMMANDS_ADDED = True
        try:
            from kvbridge.plugins import get_host

            get_host().register_commands(cli)
        except KVBridgeError as exc:
            click.echo(f"error: {exc.one_line()}", err=True)
            sys.exit(exc.exit_code)
    return cli


def main(argv=None) -> None:
    build_cli().main(args=argv, prog_name="kvbridge")


if __name__ == "__main__":  # pragma: no cover
    main()
