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


#: every command's exit statuses (the error boundary in ``cli/main.py`` and the commands that test something)
EXIT_CODES = (
    ("0", "done"),
    (
        "1",
        "it ran and the answer is no: `check` (incompatible, or `--strict` not exact), `conformance` (a type "
        "wrong or crashed), `eval` (an enforced quality gate failed), `demo` (a section not exact)",
    ),
    (
        "2",
        "bad input, refused before anything is written: one line `error: <what> (fix: <how>)` naming the "
        "file, flag or plugin (a usage error, a malformed or hostile file, a model folder that asks to "
        "run its own code, a mismatched artifact, NaN tensors, a broken plugin a command needs)",
    ),
    ("3", "an internal error (a bug in kvbridge): one line too; `KVBRIDGE_DEBUG=1` shows the traceback"),
    ("130", "interrupted (Ctrl-C); nothing half-written is left"),
)


def render() -> str:
    from kvbridge.cli.main import build_cli

    out = [
        "# kvbridge command line",
        "",
        "Generated from each command's `--help` by `make cli-docs` (a test keeps it in sync).",
        "",
        "## Exit status",
        "",
        "| status | meaning |",
        "|---:|---|",
        *(f"| {code} | {meaning} |" for code, meaning in EXIT_CODES),
        "",
    ]
    for path, text in _walk(build_cli(), ["kvbridge"]):
        out += [f"## `{' '.join(path)}`", "", "```", text.rstrip(), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
