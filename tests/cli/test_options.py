"""kvbridge.cli.options: the shared options."""

from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner

import kvbridge.cli as cli_pkg
from kvbridge.cli.options import json_option


def test_json_option_sets_as_json_with_the_default_or_given_help():
    @click.command()
    @json_option
    def plain(as_json):
        click.echo(repr(as_json))

    @click.command()
    @json_option(help="Print X as JSON.")
    def custom(as_json):
        click.echo(repr(as_json))

    runner = CliRunner()
    assert runner.invoke(plain, ["--json"]).output.strip() == "True"
    assert runner.invoke(plain, []).output.strip() == "False"
    assert "Machine-readable output." in runner.invoke(plain, ["--help"]).output
    assert "Print X as JSON." in runner.invoke(custom, ["--help"]).output


def test_no_command_spells_json_inline():
    """``--json`` has one definition (json_option); commands use it instead of their own click.option."""
    folder = Path(cli_pkg.__file__).parent
    inline = [p.name for p in folder.glob("*.py") if p.name != "options.py" and '"--json"' in p.read_text()]
    assert inline == []


def test_open_model_is_models_load_with_the_tokenizer_option(tmp_path):
    """``open_model``: the model through :func:`kvbridge.models.load`; ``--tokenizer`` replaces its tokenizer."""
    import shutil

    from kvbridge.cli.options import open_model
    from kvbridge.zoo import model_dir

    own = open_model("zoo:base")
    assert own.ref.kind == "zoo" and own.tokenizer is not None
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir("base") / name).is_file():
            shutil.copy(model_dir("base") / name, folder / name)
    other = open_model("zoo:base", str(folder))
    assert other.tokenizer is not own.tokenizer and other.fingerprint == own.fingerprint
    text = "To be, or not to be"
    assert other.tokenizer(text)["input_ids"] == own.tokenizer(text)["input_ids"]
