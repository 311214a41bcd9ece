"""``kvbridge zoo``: the tiny model zoo shipped with kvbridge (``list``); ``build`` (deprecated) runs the
checkout's ``python -m tools.zoo.build``.

``zoo list`` reads only the manifest: it imports neither torch nor transformers.
"""

from __future__ import annotations

from pathlib import Path

import click

from kvbridge.cli.options import echo_result, json_option


def manifest_table(manifest: dict) -> str:
    """The zoo's table (``zoo list``; the build prints it too)."""
    cols = [
        "name",
        "layers",
        "hidden",
        "heads",
        "kv x dim",
        "rope theta",
        "params",
        "train tokens",
        "held-out loss",
        "unigram H",
        "MB",
        "init / seed",
    ]
    rows = []
    for name in manifest.get("names") or list(manifest["models"]):
        m = manifest["models"][name]
        a = m["architecture"]
        weights = next((f for p, f in m["files"].items() if p.endswith(".safetensors")), {"bytes": 0})
        rows.append(
            [
                name,
                str(a["num_hidden_layers"]),
                str(a["hidden_size"]),
                str(a["num_attention_heads"]),
                f"{a['num_key_value_heads']} x {a['head_dim']}",
                f"{a['rope_theta']:g}",
                f"{m['params'] / 1e6:.2f}M",
                f"{m['total_training_tokens']:,}",
                f"{m['heldout_loss']:.3f}",
                f"{m['unigram_entropy']:.3f}",
                f"{weights['bytes'] / 1e6:.1f}",
                (f"{m['init_from']} + " if m.get("init_from") else "") + f"seed {m['seed']}",
            ]
        )
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    lines = [fmt.format(*cols), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows]
    corpus = manifest["corpus"]
    tok = manifest["tokenizer"]
    lines += [
        "",
        f"tokenizer: {tok['kind']}, {tok['vocab_size']} ids; losses in nats/token on the held-out slice "
        f"({manifest['heldout']['scored_tokens']:,} tokens)",
        f"corpus: {corpus['name']} sha256:{corpus['sha256'][:12]}  built with torch "
        f"{manifest['built_with']['torch']}  recipe {manifest['zoo_recipe_hash'][:12]}",
    ]
    return "\n".join(lines)


@click.group("zoo")
def zoo() -> None:
    """The tiny model zoo: small Llama models trained on tiny-Shakespeare.

    base, wide (same KV heads/head dim, other depth/width/RoPE), odd (other KV geometry),
    tuned (base fine-tuned on a disjoint slice) and stranger (base's architecture, other seed)
    share one byte-level BPE tokenizer and ship as package data.
    """


@zoo.command("list")
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    help="A zoo folder (default: $KVBRIDGE_ZOO_DIR, else the shipped one).",
)
@json_option(help="Print the whole manifest as JSON.")
def list_cmd(root, as_json) -> None:
    """List the zoo models and their measured losses.

    One row per model: geometry, training tokens, held-out loss (nats/token) next to the
    unigram entropy of the same held-out slice, weights size. Reads only the manifest.
    """
    from kvbridge.zoo import read_manifest, zoo_dir

    manifest = read_manifest(root)
    text = f"zoo: {Path(root or zoo_dir())}\n{manifest_table(manifest)}"
    echo_result(manifest, as_json, text, indent=1, sort_keys=True)


@zoo.command("build")
@click.option(
    "--corpus",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="tinyshakespeare.txt (default: ../shared/corpora/ beside the repo).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write the zoo (default: the package's zoo/models, replacing it).",
)
def build_cmd(corpus, out) -> None:
    """Deprecated: run `python -m tools.zoo.build` from a kvbridge checkout.

    Rebuilds the zoo from its recipes and the corpus (about 20 minutes on one CPU core): the
    build tooling lives in the repository's tools/, not in the package, so this command works
    only from a checkout (it runs the same build).
    """
    import sys

    root = Path(__file__).resolve().parents[3]
    if not (root / "tools" / "zoo" / "build.py").is_file():
        from kvbridge.errors import ConfigError

        raise ConfigError(
            "`kvbridge zoo build` needs a kvbridge checkout (the zoo's build tooling is not installed)",
            "clone the repository and run `python -m tools.zoo.build --corpus PATH` from its root",
        )
    click.echo("kvbridge: `kvbridge zoo build` is deprecated; use `python -m tools.zoo.build`", err=True)
    sys.path.insert(0, str(root))
    from tools.zoo.build import build_zoo

    click.echo(manifest_table(build_zoo(corpus=corpus, out=out)))
