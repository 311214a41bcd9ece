"""``kvbridge conformance``: check kvbridge against every causal-LM model type of transformers."""

from __future__ import annotations

import json

import click


@click.command("conformance")
@click.option("--types", "types", default="", help="Comma-separated model types (default: the whole registry).")
@click.option("--json", "as_json", is_flag=True, help="Print {transformers, summary, results: [...]} as JSON.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False), default=None,
              help="Write the supported-models table (Markdown) to this file.")
@click.option("--from", "from_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Render results saved by an earlier --json run instead of running the sweep.")
def conformance(types: str, as_json: bool, markdown_path: str | None, from_path: str | None) -> None:
    """Build a tiny random model of each causal-LM model type in transformers and classify it:
    exact (describe matches the real cache, identity transfer exact), refused (with the reason),
    not-built (transformers could not build it), wrong or crash.

    The full registry takes many minutes; run it under `nice`, in chunks with --types.
    Exit status 1 when any type is wrong or crashed.
    """
    from kvbridge.conformance import report, sweep
    from kvbridge.errors import ConfigError

    if from_path:
        results = report.load(from_path)
        if types:
            wanted = {t.strip() for t in types.split(",") if t.strip()}
            results = [r for r in results if r.model_type in wanted]
    else:
        import transformers

        wanted = [t.strip() for t in types.split(",") if t.strip()] or None
        if wanted:
            known = set(sweep.all_types())
            bad = [t for t in wanted if t not in known]
            if bad:
                raise ConfigError(f"--types: {bad[0]!r} is not a causal-LM model type of transformers "
                                  f"{transformers.__version__}", "see MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")

        def progress(r):  # to stderr under --json, so stdout stays one JSON document
            click.echo(f"  {r.model_type:<28} {r.status:<9} {r.adapter:<24} {r.reason[:90]}", err=as_json)

        results = sweep.run(wanted, progress=progress)
    import transformers

    if markdown_path:
        from pathlib import Path

        path = Path(markdown_path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(report.markdown(results, transformers_version=transformers.__version__))
        tmp.replace(path)
    if as_json:
        click.echo(json.dumps({"transformers": transformers.__version__, "summary": report.counts(results),
                               "results": [r.to_dict() for r in results]}, indent=2))
    else:
        click.echo(report.summary_line(results))
    bad = [r for r in results if r.status in ("wrong", "crash")]
    raise SystemExit(1 if bad else 0)
