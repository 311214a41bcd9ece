"""Root ``kvbridge`` command group.

Every command, the built-in ones included (:mod:`kvbridge.builtin.commands`), arrives through the
``kvbridge_register_commands`` hook, the first time the group lists or looks up a command. The
built-ins are :class:`kvbridge.cli.lazy.LazyCommand` entries (``name -> "module:attr"``), imported
only when invoked or listed by ``--help``; command modules import neither torch nor transformers
at module level, so start-up stays light.
"""

from __future__ import annotations

import os
import sys

import click

from kvbridge.version import __version__
from kvbridge.cli.lazy import LazyCommand
from kvbridge.errors import KVBridgeError, from_exception


class LazyGroup(click.Group):
    """A group whose commands come from the plugin host on first use and import lazily."""

    registered = False

    def register_plugin_commands(self) -> None:
        """Add every command the host's ``kvbridge_register_commands`` implementations offer (once)."""
        if self.registered:
            return
        self.registered = True
        try:
            from kvbridge.plugins import get_host

            get_host().register_commands(self)
        except KVBridgeError as exc:
            report(exc)
            sys.exit(exc.exit_code)

    def list_commands(self, ctx):
        self.register_plugin_commands()
        return sorted(n for n, c in self.commands.items() if not isinstance(c, LazyCommand) or c.available())

    def get_command(self, ctx, name):
        self.register_plugin_commands()
        cmd = self.commands.get(name)
        if isinstance(cmd, LazyCommand):
            if not cmd.available():
                return None
            cmd = self.commands[name] = cmd.load()
        return cmd

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("error: interrupted (nothing half-written was left; --resume continues a fit)", err=True)
            ctx.exit(130)
        except Exception as exc:  # noqa: BLE001 - the one error boundary (a sub-command's usage errors too)
            if os.environ.get("KVBRIDGE_DEBUG"):
                raise
            err = usage_error(exc, ctx) if isinstance(exc, click.ClickException) else from_exception(exc)
            report(err)
            ctx.exit(err.exit_code)  # 2 for a usage error

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Like click's, with the group's own usage errors (``kvbridge --bogus``) as one line, and
        every byte written through the output guard (:mod:`kvbridge.cli.output`)."""
        from kvbridge.cli.output import guarded_output

        with guarded_output():
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


def build_cli() -> click.Group:
    """The root group with every registered command added (once)."""
    cli.register_plugin_commands()
    return cli


def main(argv=None) -> None:
    build_cli().main(args=argv, prog_name="kvbridge")


if __name__ == "__main__":  # pragma: no cover
    main()
