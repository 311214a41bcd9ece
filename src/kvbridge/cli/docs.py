"""Generate CLI.md: every command's ``--help``, recursively (``make cli-docs``)."""

from __future__ import annotations

import click


def _walk(cmd: click.Command, path: list[str], ctx_parent=None):
    settings = {"terminal_width": 100, "max_content_width": 100, **cmd.context_settings}
    ctx = cmd.context_class(cmd, info_name=path[-1], parent=ctx_parent, **settings)
    yield path, cmd.get_help(ctx)
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not getattr(sub, "hidden", False):
                yield from _walk(sub, path + [name], ctx)


def render() -> str:
    from kvbridge.cli.main import build_cli

    out = ["# kvbridge command line", "",
           "Generated from each command's `--help` by `make cli-docs` (a test keeps it in sync).", ""]
    for path, text in _walk(build_cli(), ["kvbridge"]):
        out += [f"## `{' '.join(path)}`", "", "```", text.rstrip(), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
