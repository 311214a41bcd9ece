"""Campaign, class "plugins that misbehave": for every hook, a plugin that raises, exits, returns the
wrong type or shadows a built-in; for imports, one that raises, exits or never returns. The host
isolates each: a one-line warning naming the plugin (or a one-line error where the command cannot go
on), never an internal error (exit 3), a traceback or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from kvbridge import plugins as plugins_mod
from kvbridge.hookspecs import hookimpl


@pytest.fixture
def with_plugins(monkeypatch):
    """``install(**plugins)``: the process host = built-ins + these plugins (no entry points)."""
    from kvbridge.cli import main as main_mod

    def install(**extra):
        main_mod.build_cli()  # the commands of the real host first; the plugins below add none to it
        host = plugins_mod.make_host(entry_points=False, extra=list(extra.items()))
        monkeypatch.setattr(plugins_mod, "_DEFAULT", host)
        monkeypatch.setattr(main_mod.cli, "registered", True)
        return host

    return install


def no_internal_error(res):
    assert res.exit_code != 3 and "internal error" not in res.output, res.output
    assert "Traceback" not in res.output and "Traceback" not in res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)


def warned(res, plugin: str) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: ") and repr(plugin) in ln]
    assert len(lines) == 1, res.stderr
    return lines[0]


# -- check hook: raise / exit / wrong type ----------------------------------------------------------------
def _check_plugin(result):
    class P:
        @hookimpl
        def kvbridge_check_compatibility(self, source, target):
            if isinstance(result, BaseException):
                raise result
            return result

    return P()


@pytest.mark.parametrize(
    "result",
    [
        "not a list",
        ["not a finding"],
        42,
        {"axis": "x"},
        [None],
    ],
    ids=["str", "list-of-str", "int", "dict", "list-of-none"],
)
def test_check_hook_wrong_type_disables_the_plugin(world, c, with_plugins, result):
    host = with_plugins(badcheck=_check_plugin(result))
    res = c.cli(["check", world.src, world.tgt])
    no_internal_error(res)
    assert res.exit_code in (0, 1), res.output
    assert "kvbridge_check_compatibility" in warned(res, "badcheck")
    assert host.pm.get_plugin("badcheck") is None and host.record("badcheck").error


@pytest.mark.parametrize(
    "exc", [RuntimeError("boom"), SystemExit(3), SystemExit("bye")], ids=["raise", "exit3", "exit-str"]
)
def test_check_hook_that_raises_or_exits(world, c, with_plugins, exc):
    with_plugins(badcheck=_check_plugin(exc))
    res = c.cli(["check", world.src, world.tgt])
    no_internal_error(res)
    assert res.exit_code in (0, 1), res.output


def test_check_hook_with_a_bad_verdict(world, c, with_plugins):
    from kvbridge.plugin_types import Finding

    with_plugins(badcheck=_check_plugin([Finding("x", "catastrophic", "m")]))
    res = c.cli(["check", world.src, world.tgt])
    no_internal_error(res)
    warned(res, "badcheck")


# -- family resolver -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "answer", [7, "llama", object(), SystemExit(0), ValueError("no")], ids=["int", "str", "object", "exit", "raise"]
)
def test_family_resolver_bad_answer(world, tmp_path, c, with_plugins, answer):
    class P:
        @hookimpl
        def kvbridge_resolve_family(self, config):
            if isinstance(answer, BaseException):
                raise answer
            return answer

    with_plugins(badfamily=P())
    folder = tmp_path / "m"
    folder.mkdir()
    cfg = json.loads((world.src / "config.json").read_text())
    cfg["model_type"] = "mystery-type"
    (folder / "config.json").write_text(json.dumps(cfg))
    res = c.cli(["describe", folder])
    no_internal_error(res)
    c.error(res, "mystery-type")
    if not isinstance(answer, BaseException):
        assert "kvbridge_resolve_family" in warned(res, "badfamily")


# -- manifest folders ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "answer",
    [42, {"a": 1}, [1, 2], ["ok", None, 3.5], SystemExit(2), OSError("gone")],
    ids=["int", "dict", "ints", "mixed", "exit", "raise"],
)
@pytest.mark.parametrize("cmd", ["describe-list", "check-name", "plugins"])
def test_manifest_dirs_bad_answer(world, c, with_plugins, answer, cmd):
    class P:
        @hookimpl
        def kvbridge_manifest_dirs(self):
            if isinstance(answer, BaseException):
                raise answer
            return answer

    with_plugins(baddirs=P())
    args = {
        "describe-list": ["describe", "--list"],
        "check-name": ["check", "gpt-j", world.src],
        "plugins": ["plugins"],
    }[cmd]
    res = c.cli(args)
    no_internal_error(res)
    if not isinstance(answer, BaseException):
        assert "kvbridge_manifest_dirs" in warned(res, "baddirs")


# -- registration hooks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "hook",
    [
        "kvbridge_register_fitters",
        "kvbridge_register_metrics",
        "kvbridge_register_rope_variants",
        "kvbridge_register_families",
        "kvbridge_register_model_sources",
    ],
)
@pytest.mark.parametrize("how", ["raise", "exit", "garbage"])
def test_registration_hooks_misbehave(world, c, with_plugins, hook, how):
    def impl(self, register):
        if how == "raise":
            raise RuntimeError("broken registration")
        if how == "exit":
            sys.exit(4)
        if hook == "kvbridge_register_model_sources":
            register(12, "not callable")
        else:
            register(12345)

    P = type("P", (), {hook: hookimpl(impl)})
    with_plugins(badreg=P())
    for args in (["plugins"], ["check", world.src, world.tgt], ["describe", world.src]):
        res = c.cli(args)
        no_internal_error(res)


# -- fitters whose factory cannot be loaded -------------------------------------------------------------------
@pytest.mark.parametrize("factory", ["no_such_module_kvb26:Fitter", "json:NoSuchClass", "kvbridge:__version__"])
def test_fitter_factory_that_cannot_load_is_one_line(world, tmp_path, c, with_plugins, factory):
    from kvbridge.plugin_types import Fitter

    class P:
        @hookimpl
        def kvbridge_register_fitters(self, register):
            register(Fitter("ghost", "a fitter whose module is gone", factory))

    with_plugins(ghostplug=P())
    res = c.cli(world.fit_args(tmp_path / "m", "--fitter", "ghost"))
    no_internal_error(res)
    c.error(res, "ghost")
    assert not (tmp_path / "m").exists()


# -- real processes: entry points that raise, exit, hang, shadow a built-in command -----------------------------
PLUGIN_MODULES = {
    "exits": "import sys\nsys.exit(3)\n",
    "raises": "raise ImportError('a dependency is missing')\n",
    "hangs": "import time\nwhile True:\n    time.sleep(0.05)\n",
    "shadows": textwrap.dedent("""
        import click
        from kvbridge.hookspecs import hookimpl

        @click.command("describe")
        def fake():
            click.echo("SHADOWED")

        @click.command("kvb26-extra")
        def extra():
            click.echo("extra ran")

        @hookimpl
        def kvbridge_register_commands(cli):
            cli.add_command(fake)
            cli.add_command(extra)
    """),
}


def _install_entry_points(root, names):
    """A site folder holding one distribution whose ``kvbridge`` entry points are ``names``."""
    dist = root / "kvb26_plugins-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kvb26-plugins\nVersion: 0.1\n")
    lines = ["[kvbridge]"] + [f"{n} = kvb26_{n}" for n in names]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for n in names:
        (root / f"kvb26_{n}.py").write_text(PLUGIN_MODULES[n])


def _run(root, *args, timeout=120, **env):
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path]), "HF_HUB_OFFLINE": "1", **env}
    full.pop("KVBRIDGE_LOAD_PLUGINS", None)
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "kvbridge", *map(str, args)],
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return res, time.monotonic() - start


def test_entry_points_that_exit_raise_hang_or_shadow(world, tmp_path):
    _install_entry_points(tmp_path, ["exits", "raises", "hangs", "shadows"])
    res, secs = _run(tmp_path, "check", world.src, world.tgt, KVBRIDGE_PLUGIN_IMPORT_TIMEOUT="1.5")
    assert res.returncode in (0, 1), res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: plugin ")]
    for name, needle in (
        ("exits", "sys.exit(3)"),
        ("raises", "a dependency is missing"),
        ("hangs", "did not finish within 1.5 s"),
        ("shadows", "'describe'"),
    ):
        line = [ln for ln in warnings if f"plugin {name!r}" in ln]
        assert len(line) == 1 and needle in line[0], (name, res.stderr)
    assert secs < 60, secs  # the hung import cost its time box, not forever
    res, _ = _run(tmp_path, "describe", world.src, KVBRIDGE_PLUGIN_IMPORT_TIMEOUT="0.5")
    assert res.returncode == 0 and "SHADOWED" not in res.stdout and "llama" in res.stdout, (res.stdout, res.stderr)
    res, _ = _run(tmp_path, "kvb26-extra", KVBRIDGE_PLUGIN_IMPORT_TIMEOUT="0.5")
    assert res.returncode == 0 and "extra ran" in res.stdout, res.stderr  # a plugin's own command still works
    res, _ = _run(tmp_path, "plugins", "--json", KVBRIDGE_PLUGIN_IMPORT_TIMEOUT="0.5")
    rows = {p["name"]: p for p in json.loads(res.stdout)["plugins"]}
    assert {"exits", "raises", "hangs", "shadows"} <= set(rows) and rows["exits"]["error"], rows


@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_import_timeout_env_is_checked(monkeypatch, value):
    from kvbridge.errors import PluginError

    monkeypatch.setenv(plugins_mod.IMPORT_TIMEOUT_ENV, value)
    with pytest.raises(PluginError, match=plugins_mod.IMPORT_TIMEOUT_ENV):
        plugins_mod.import_timeout()
