"""``kvbridge conformance``: check kvbridge against every causal-LM model type of transformers."""

from __future__ import annotations

import json

import click

from kvbridge.cli.options import json_option


@click.command("conformance")
@click.option("--types", "types", default="", help="Comma-separated model types (default: the whole registry).")
@json_option(help="Print {transformers, summary, results: [...]} as JSON.")
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False),
    help="Write the supported-models table (Markdown) to this file, and the results as JSON beside it "
    "(same name, .json).",
)
@click.option(
    "--from",
    "from_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Render results saved by an earlier --json run instead of running the sweep.",
)
@click.option(
    "--merge",
    "merge_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Saved results (e.g. docs/supported-models.json): replace only the rows of these results in "
    "it, write it back, and render the whole table from it.",
)
def conformance(
    types: str, as_json: bool, markdown_path: str | None, from_path: str | None, merge_path: str | None
) -> None:
    """Build a tiny random model of each causal-LM model type in transformers and classify it:
    exact (describe matches the real cache, identity transfer exact), refused (with the reason),
    not-built (transformers could not build it), wrong or crash.

    The full registry takes many minutes; run it under `nice`, in chunks with --types. To update
    some rows of the published table: --types a,b --merge docs/supported-models.json --markdown
    docs/supported-models.md. Exit status 1 when any type is wrong or crashed.
    """
    from pathlib import Path

    from kvbridge.artifacts import write_file_atomic
    from kvbridge.conformance import report, sweep
    from kvbridge.errors import ConfigError, names_value

    wanted = list(names_value(types, "--types"))
    if merge_path and not (wanted or from_path):
        raise ConfigError(
            "--merge replaces the rows of some model types, but none were given",
            "add --types a,b (or --from FILE with the new rows)",
        )
    updates: list = []
    if from_path:
        doc = report.load_doc(from_path)
        results, version, updates = doc["results"], doc["transformers"], doc["updates"]
        if wanted:
            results = [r for r in results if r.model_type in set(wanted)]
    else:
        import transformers

        version = transformers.__version__
        if wanted:
            known = set(sweep.all_types())
            bad = [t for t in wanted if t not in known]
            if bad:
                raise ConfigError(
                    f"--types: {bad[0]!r} is not a causal-LM model type of transformers {transformers.__version__}",
                    "see MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
                )

        def progress(r):  # to stderr under --json, so stdout stays one JSON document
            click.echo(f"  {r.model_type:<28} {r.status:<9} {r.adapter:<24} {r.reason[:90]}", err=as_json)

        results = sweep.run(wanted or None, progress=progress)
    new = results
    if merge_path:
        base = report.load_doc(merge_path)
        if base["transformers"] and version and base["transformers"] != version:
            raise ConfigError(
                f"--merge: {merge_path} was made with transformers {base['transformers']}, these rows"
                f" with {version} (one table, one version)",
                "rerun the whole sweep with this transformers, or install the table's version",
            )
        results = report.merge(base["results"], new)
        updates = base["updates"] + [sorted(r.model_type for r in new)]
    doc = json.dumps(report.document(results, transformers_version=version, updates=updates), indent=2)
    if merge_path:
        write_file_atomic(merge_path, doc + "\n")
    if markdown_path:
        path = Path(markdown_path)
        write_file_atomic(path, report.markdown(results, transformers_version=version, updates=updates))
        beside = path.with_suffix(".json")
        if not merge_path or Path(merge_path).resolve() != beside.resolve():
            write_file_atomic(beside, doc + "\n")
    click.echo(doc if as_json else report.summary_line(results))
    raise SystemExit(int(any(r.status in ("wrong", "crash") for r in new)))
