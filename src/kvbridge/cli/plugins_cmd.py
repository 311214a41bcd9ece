"""``kvbridge plugins``: every plugin, its version, hooks and what it registers."""

from __future__ import annotations

import click

from kvbridge.cli.options import echo_result, json_option


@click.command("plugins")
@json_option
def plugins(as_json: bool) -> None:
    """List installed plugins (built-in and third-party) and what each registers.

    Plugins that failed to load are listed with their error; the rest keep working.
    Environment: KVBRIDGE_LOAD_PLUGINS (allow-list, empty = none),
    KVBRIDGE_DISABLE_PLUGINS (block-list), KVBRIDGE_TRACE_PLUGINS (trace hook calls).
    """
    from kvbridge.plugins import get_host

    host = get_host()
    host.load_all()  # fills each record's "registers" and errors; duplicate names raise a one-line error
    records = [r.to_dict() for r in host.records]
    lines = []
    for r in records:
        tag = "built-in" if r["builtin"] else "third-party"
        status = click.style("FAILED", fg="red") if r["error"] else click.style("ok", fg="green")
        lines.append(f"{click.style(r['name'], bold=True)} {r['version']} ({tag}) {status}")
        lines += [f"    error: {r['error']}"] if r["error"] else []
        lines += [f"    hooks: {', '.join(r['hooks'])}"] if r["hooks"] else []
        lines += [f"    {kind}: {', '.join(names)}" for kind, names in sorted(r["registers"].items())]
    echo_result({"plugins": records}, as_json, lines)
