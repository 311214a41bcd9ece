"""kvbridge.settings_fields: a settings field declares its option once; counts are checked from the kinds."""

from __future__ import annotations

from dataclasses import dataclass

import click
import pytest
from click.testing import CliRunner

from kvbridge.errors import ConfigError
from kvbridge.settings_fields import check_counts, flag_of, option, option_fields


@dataclass(frozen=True)
class Inner:
    depth: int = option(2, "Depth.", flags=("--inner-depth",), kind=("count", 1), show_default=True)

    def __post_init__(self):
        check_counts(self)


@dataclass(frozen=True)
class Demo:
    name: str = option(help="A name.", required=True)
    size: int = option(3, "Size.", kind=("count", 1), show_default=True)
    seed: int = option(0, "Seed.", kind="seed")
    share: float | None = option(
        None, "Share.", kind="share", cli_default=0.5, default_if_not_given=True, show_default=True
    )
    color: bool = option(True, "No color.", flags=("--no-color",), flag=True, invert=True)
    tags: tuple = option((), "A tag.", flags=("--tag",), multiple=True)
    inner: Inner = option(Inner, nested=True)

    def __post_init__(self):
        check_counts(self)


def test_fields_declare_their_flags_in_order():
    names = [f.name for f, _ in option_fields(Demo)]
    assert names == ["name", "size", "seed", "share", "color", "tags", "inner"]
    f, opt = option_fields(Demo)[4]
    assert flag_of(f, opt) == "--no-color"


@pytest.mark.parametrize(
    "kwargs, needle",
    [(dict(size=0), "--size must be a whole number >= 1"), (dict(seed=-1), "--seed must be a whole number >= 0")],
)
def test_counts_are_checked_from_the_kinds(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        Demo(name="x", **kwargs)
    with pytest.raises(ConfigError, match="--inner-depth"):
        Inner(depth=0)


def test_click_options_are_built_from_the_fields_and_give_the_settings_back():
    from kvbridge.cli.options import settings_from, settings_options

    @click.command()
    @settings_options(Demo)
    def cmd(**options):
        click.echo(repr(settings_from(Demo, options)))

    runner = CliRunner()
    help_text = runner.invoke(cmd, ["--help"]).output
    assert "--size INTEGER" in help_text and "[default: 3]" in help_text and "--no-color" in help_text
    assert "--inner-depth" in help_text and "[default: 0.5]" in help_text
    out = runner.invoke(cmd, ["--name", "a"]).output
    assert "share=None" in out and "color=True" in out and "tags=()" in out and "depth=2" in out
    out = runner.invoke(
        cmd, ["--name", "a", "--share", "0.25", "--no-color", "--tag", "x", "--inner-depth", "5"]
    ).output
    assert "share=0.25" in out
    assert "color=False" in out and "tags=('x',)" in out and "depth=5" in out
    bad = runner.invoke(cmd, ["--name", "a", "--size", "0"])
    assert bad.exit_code == 2 and "--size" in bad.output


def test_shared_options_are_declared_once():
    from kvbridge.cli.options import settings_from, settings_options
    from kvbridge.settings_fields import out_option, overwrite_option, seed_option

    @dataclass(frozen=True)
    class Shared:
        where: str
        out: str | None = out_option("Folder.")
        seed: int = seed_option("A seed.", 3)
        overwrite: bool = overwrite_option()

        def __post_init__(self):
            check_counts(self)

    got = {}

    @click.command()
    @click.argument("where")
    @settings_options(Shared)
    def cmd(where, **values):
        got["s"] = settings_from(Shared, values, given={"where": where})

    res = CliRunner().invoke(cmd, ["here", "--out", "o", "--overwrite"])
    assert res.exit_code == 0, res.output
    assert got["s"] == Shared(where="here", out="o", seed=3, overwrite=True)
    assert "[default: 3]" in CliRunner().invoke(cmd, ["--help"]).output
    assert CliRunner().invoke(cmd, ["x", "--seed", "-1"]).exit_code == 2  # a seed's type
    with pytest.raises(ConfigError, match="--seed must be a whole number"):
        Shared(where="x", seed=-1)


def test_check_kinds_refuses_a_value_outside_a_choice_naming_the_flag():
    from kvbridge.settings_fields import check_kinds

    @dataclass(frozen=True)
    class Pick:
        mode: str = option("a", "Mode.", kind=("choice", ("a", "b")))
        n: int = option(1, "N.", kind=("count", 1))

        def __post_init__(self):
            check_kinds(self)

    assert Pick(mode="b").mode == "b"
    with pytest.raises(ConfigError, match=r"--mode must be one of a, b, got 'c'") as err:
        Pick(mode="c")
    assert "--mode a" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="--n must be a whole number >= 1"):
        Pick(n=0)


def test_check_kinds_passes_a_none_default_and_checks_reals_and_shares():
    from kvbridge.settings_fields import check_kinds

    @dataclass(frozen=True)
    class Kinds:
        sweep: str | None = option(None, "Sweep.", kind=("choice", ("x", "y")))
        t: float = option(0.7, "T.", kind=("real", 0, {"min_open": True}))
        p: float = option(0.9, "P.", kind="share")
        c: float | None = option(None, "C.", kind=("real",))

        def __post_init__(self):
            check_kinds(self)

    assert Kinds().sweep is None and Kinds(sweep="y", c=-2.0).c == -2.0
    with pytest.raises(ConfigError, match="--sweep must be one of x, y, got 'z'"):
        Kinds(sweep="z")
    with pytest.raises(ConfigError, match="--t must be a finite number > 0, got 0"):
        Kinds(t=0)
    for bad in (0, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ConfigError, match=r"--p must be a finite number > 0 and <= 1"):
            Kinds(p=bad)
    with pytest.raises(ConfigError, match="--c must be a finite number, got inf"):
        Kinds(c=float("inf"))
