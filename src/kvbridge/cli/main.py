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

from kvbridge.version import __version__
from kvbridge.errors import KVBridgeError, from_exception

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
    "harness": "kvbridge.cli.harness_cmd:harness",
    "engine": "kvbridge.cli.engine_cmd:engine",
    "steer": "kvbridge.cli.steer_cmd:steer",
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
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except click.ClickException as exc:  # usage errors of a sub-command: one line too
            if os.environ.get("KVBRIDGE_DEBUG"):
                raise
            report(usage_error(exc, ctx))
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("error: interrupted (nothing half-written was left; --resume continues a fit)", err=True)
            ctx.exit(130)
        except Exception as exc:  # noqa: BLE001 - the one error boundary
            if os.environ.get("KVBRIDGE_DEBUG"):
                raise
            err = from_exception(exc)
            report(err)
            ctx.exit(err.exit_code)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Like click's, with the group's own usage errors (``kvbridge --bogus``) as one line, and
        every byte written through the output guard (:mod:`kvbridge.cli.output`)."""
        from kvbridge.cli.output import guarded_output

        with guarded_output():
            return self._main(args, prog_name, complete_var, standalone_mode, **extra)

    def _main(self, args, prog_name, complete_var, standalone_mode, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(1)
        except click.ClickException as exc:
            if os.environ.get("KVBRIDGE_DEBUG"):
                raise
            report(usage_error(exc, None))
            sys.exit(2)
        sys.exit(rv if isinstance(rv, int) else 0)


def usage_error(exc: click.ClickException, ctx) -> KVBridgeError:
    """A click usage error (bad option value, unknown option) as a one-line error with a fix."""
    sub = getattr(exc, "ctx", None) or ctx
    where = sub.command_path if sub is not None else "kvbridge"
    return KVBridgeError(exc.format_message(), f"see `{where} --help`")


def report(err: KVBridgeError) -> None:
    """Print ``error: <what> (fix: <how>)`` on stderr, exactly one line."""
    click.echo(f"error: {err.one_line()}", err=True)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvbridge")
def cli() -> None:
    """kvbridge: move attention KV caches between transformer language models.

    Exact where exactness is possible (same-model identity transfer, prefix packs),
    measured where it is not (fitted mappings, quality reports with controls).
    Errors on bad input are one line, `error: <what> (fix: <how>)`, exit 2; an unexpected
    internal error is one line too, exit 3. Set KVBRIDGE_DEBUG=1 to see tracebacks.
    """


_PLUGIN_COMMANDS_ADDED = False


def build_cli() -> click.Group:
    """The root group with plugin commands added (once)."""
    global _PLUGIN_COMMANDS_ADDED
    if not _PLUGIN_COMMANDS_ADDED:
        _PLUGIN_COMMANDS_ADDED = True
        try:
            from kvbridge.plugins import get_host

            get_host().register_commands(cli, reserved=tuple(COMMANDS))
        except KVBridgeError as exc:
            click.echo(f"error: {exc.one_line()}", err=True)
            sys.exit(exc.exit_code)
    return cli


def main(argv=None) -> None:
    build_cli().main(args=argv, prog_name="kvbridge")


if __name__ == "__main__":  # pragma: no cover
    main()
