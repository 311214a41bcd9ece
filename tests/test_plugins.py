"""The plugin host: built-ins through the same manager, guarded loading, env vars, getters."""

from __future__ import annotations

import json
from importlib import metadata

import pytest
from click.testing import CliRunner

from kvbridge import plugins as plugins_mod
from kvbridge.errors import PluginError, UnsupportedModelError
from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Finding, Fitter, Metric


class _Fitters:
    @hookimpl
    def kvbridge_register_fitters(self, register):
        register(Fitter(name="toy", description="a toy", factory="builtins:dict"))


class _SameFitterName:
    @hookimpl
    def kvbridge_register_fitters(self, register):
        register(Fitter(name="toy", description="again", factory="builtins:dict"))


class _Misspelt:
    @hookimpl
    def kvbridge_register_fitter(self, register):  # missing "s"
        pass


class _Raises:
    @hookimpl
    def kvbridge_register_metrics(self, register):
        raise RuntimeError("boom")


def test_builtins_register_through_the_same_manager():
    host = plugins_mod.make_host(entry_points=False)
    names = [r.name for r in host.records]
    assert names == list(plugins_mod.BUILTIN_PLUGINS)
    assert all(r.builtin and r.error is None for r in host.records)
    assert "identity" in host.registry("fitter").names()
    assert host.pm.get_plugin("kvbridge.builtin.identity") is not None


def test_extra_plugin_registers_and_typed_getter_finds_it():
    host = plugins_mod.make_host(entry_points=False, extra=[("toyplugin", _Fitters())])
    assert host.entry("fitter", "toy").description == "a toy"
    rec = next(r for r in host.records if r.name == "toyplugin")
    assert rec.registers == {"fitter": ["toy"]}
    with pytest.raises(PluginError, match="did you mean toy"):
        host.entry("fitter", "tyo")


def test_duplicate_names_are_an_error_naming_both_plugins():
    host = plugins_mod.make_host(entry_points=False, extra=[("first", _Fitters()), ("second", _SameFitterName())])
    with pytest.raises(PluginError, match="'first' and 'second'"):
        host.registry("fitter")


def test_misspelt_hook_is_reported_and_not_registered():
    host = plugins_mod.make_host(entry_points=False, extra=[("typo", _Misspelt())])
    rec = next(r for r in host.records if r.name == "typo")
    assert "kvbridge_register_fitter" in rec.error and "did you mean kvbridge_register_fitters" in rec.error
    assert host.pm.get_plugin("typo") is None
    assert "identity" in host.registry("fitter").names()  # the rest keeps working


def test_plugin_whose_hook_raises_is_reported_and_the_rest_works():
    host = plugins_mod.make_host(entry_points=False, extra=[("raiser", _Raises())])
    host.registry("metric")
    rec = next(r for r in host.records if r.name == "raiser")
    assert "boom" in rec.error


def _fake_entry_points(monkeypatch, *eps):
    real = metadata.entry_points

    def fake(**kw):
        if kw.get("group") == plugins_mod.ENTRY_POINT_GROUP:
            return list(eps)
        return real(**kw)

    monkeypatch.setattr(plugins_mod.metadata, "entry_points", fake)


def test_entry_point_that_fails_to_import_is_reported(monkeypatch):
    _fake_entry_points(
        monkeypatch,
        metadata.EntryPoint("broken", "no_such_module_xyz", "kvbridge"),
        metadata.EntryPoint("good", "tests_plugin_good_mod", "kvbridge"),
    )
    import sys
    import types

    good = types.ModuleType("tests_plugin_good_mod")
    good.kvbridge_register_fitters = _Fitters().kvbridge_register_fitters
    monkeypatch.setitem(sys.modules, "tests_plugin_good_mod", good)
    host = plugins_mod.make_host()
    broken = next(r for r in host.records if r.name == "broken")
    assert "failed to import no_such_module_xyz" in broken.error
    assert host.entry("fitter", "toy")


def test_env_allow_list_and_block_list(monkeypatch):
    _fake_entry_points(monkeypatch, metadata.EntryPoint("broken", "no_such_module_xyz", "kvbridge"))
    monkeypatch.setenv("KVBRIDGE_LOAD_PLUGINS", "")
    assert [r.name for r in plugins_mod.make_host().records] == list(plugins_mod.BUILTIN_PLUGINS)
    monkeypatch.delenv("KVBRIDGE_LOAD_PLUGINS")
    monkeypatch.setenv("KVBRIDGE_DISABLE_PLUGINS", "broken,kvbridge.builtin.identity")
    names = [r.name for r in plugins_mod.make_host().records]
    assert "broken" not in names and "kvbridge.builtin.identity" not in names


def test_trace_env_writes_hook_calls(monkeypatch, capsys):
    monkeypatch.setenv("KVBRIDGE_TRACE_PLUGINS", "1")
    host = plugins_mod.make_host(entry_points=False)
    host.pm.hook.kvbridge_resolve_family(config={"model_type": "x"}, families={})
    assert "kvbridge_resolve_family" in capsys.readouterr().err


def test_resolve_family_claims_unknown_types():
    class Adapter:  # what the host checks an answer against: a family adapter's members
        name, model_types = "mystery-family", ("mystery",)

        def describe(self, config):
            return None

    ADAPTER = Adapter()

    class Claim:
        @hookimpl
        def kvbridge_resolve_family(self, config):
            return ADAPTER if config["model_type"] == "mystery" else None

    host = plugins_mod.make_host(entry_points=False, extra=[("claim", Claim())])
    assert host.adapter_for({"model_type": "mystery"}) is ADAPTER
    with pytest.raises(UnsupportedModelError, match="unknown model type 'enigma'"):
        host.adapter_for({"model_type": "enigma"})
    with pytest.raises(UnsupportedModelError, match="no attention KV cache"):
        host.adapter_for({"model_type": "mamba"})


def test_check_compatibility_hook_findings_carry_their_plugin():
    class Warns:
        @hookimpl
        def kvbridge_check_compatibility(self, source, target):
            return [Finding("known-pair", "warning", "this pair is known to degrade")]

    host = plugins_mod.make_host(entry_points=False, extra=[("warns", Warns())])
    found = [f for f in host.check_findings(None, None) if f.plugin == "warns"]
    assert found and found[0].message == "this pair is known to degrade"


def test_register_families_hook_and_duplicate_model_types():
    from dataclasses import dataclass

    from kvbridge.family_adapter import FamilyAdapter
    from kvbridge.spec import ModelSpec

    @dataclass(frozen=True)
    class Toy(FamilyAdapter):
        name: str = "toy"
        model_types: tuple = ("toyfamily",)

        def describe(self, config):
            return ModelSpec(
                model_type="toyfamily",
                num_layers=1,
                num_attention_heads=1,
                num_kv_heads=1,
                head_dim=4,
                hidden_size=4,
                positional="none",
            )

    class Fam:
        def __init__(self, adapter):
            self.adapter = adapter

        @hookimpl
        def kvbridge_register_families(self, register):
            register(self.adapter)

    host = plugins_mod.make_host(entry_points=False, extra=[("fam", Fam(Toy()))])
    assert host.describe({"model_type": "toyfamily"}).head_dim == 4
    clash = plugins_mod.make_host(entry_points=False, extra=[("fam1", Fam(Toy())), ("fam2", Fam(Toy(name="t2")))])
    with pytest.raises(PluginError, match="duplicate model type 'toyfamily'.*'fam1' and 'fam2'"):
        clash.adapters()


def test_register_metrics_and_rope_variant_hooks():
    class Adds:
        @hookimpl
        def kvbridge_register_metrics(self, register):
            register(Metric(name="toy_metric", description="d", factory="builtins:len", higher_is_better=True))

    host = plugins_mod.make_host(entry_points=False, extra=[("adds", Adds())])
    assert host.entry("metric", "toy_metric").load() is len
    assert "default" in host.registry("rope_variant").names()


def test_register_commands_hook_adds_a_cli_command(monkeypatch):
    import click

    from kvbridge.cli import main as main_mod

    @click.command("hello-plugin")
    def hello():
        click.echo("hi from a plugin")

    class Cmd:
        @hookimpl
        def kvbridge_register_commands(self, cli):
            cli.add_command(hello)

    host = plugins_mod.make_host(entry_points=False, extra=[("cmd", Cmd())])
    monkeypatch.setattr(plugins_mod, "_DEFAULT", host)
    monkeypatch.setattr(main_mod.cli, "registered", False)
    cli = main_mod.build_cli()
    try:
        result = CliRunner().invoke(cli, ["hello-plugin"])
        assert result.output.strip() == "hi from a plugin"
    finally:
        cli.commands.pop("hello-plugin", None)


def test_plugins_command_json_lists_failures(monkeypatch):
    from kvbridge.cli.main import cli

    host = plugins_mod.make_host(entry_points=False, extra=[("typo", _Misspelt())])
    monkeypatch.setattr(plugins_mod, "_DEFAULT", host)
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    rows = {p["name"]: p for p in data["plugins"]}
    assert rows["typo"]["error"].startswith("unknown hook")
    assert "identity" in rows["kvbridge.builtin.identity"]["registers"]["fitter"]
    assert rows["kvbridge.builtin.identity"]["version"]


def test_every_hook_is_documented_and_tested(repo_root):
    from kvbridge import hookspecs

    hooks = [n for n in dir(hookspecs) if n.startswith("kvbridge_")]
    assert len(hooks) >= 8
    corpus = "".join(p.read_text() for p in (repo_root / "tests").rglob("test_*.py"))
    for name in hooks:
        doc = getattr(hookspecs, name).__doc__ or ""
        assert len(doc.split()) >= 20, f"hook {name} needs a docstring (the plugin reference)"
        # a test must implement it (`def <name>(`), not just mention it
        assert f"def {name}(" in corpus, f"hook {name} has no test implementing it"


# -- pluggy's semantics --------------------------------------------------------------------------
def _order_plugins(calls):
    class Plain:
        @hookimpl
        def kvbridge_register_metrics(self, register):
            calls.append("plain")

    class First:
        @hookimpl(tryfirst=True)
        def kvbridge_register_metrics(self, register):
            calls.append("first")

    class Last:
        @hookimpl(trylast=True)
        def kvbridge_register_metrics(self, register):
            calls.append("last")

    return Plain, First, Last


def test_implementations_run_in_pluggys_order():
    calls: list = []
    plain, first, last = _order_plugins(calls)
    # registered last -> first -> plain: pluggy runs tryfirst, then the plain ones, then trylast
    host = plugins_mod.make_host(entry_points=False, extra=[("last", last()), ("first", first()), ("plain", plain())])
    host.registry("metric")
    assert calls == ["first", "plain", "last"]
    assert [o.plugin for o in host.call("kvbridge_register_metrics", register=lambda m: None)][:1] == ["first"]


def test_trace_shows_every_hook_call(monkeypatch, capsys):
    from kvbridge import hookspecs

    monkeypatch.setenv("KVBRIDGE_TRACE_PLUGINS", "1")
    host = plugins_mod.make_host(entry_points=False)
    host.registry("metric")
    host.check_findings(None, None)
    host.manifest_dirs()
    with pytest.raises(UnsupportedModelError):
        host.adapter_for({"model_type": "mystery-type"})  # asks kvbridge_resolve_family
    import click

    host.register_commands(click.Group())
    from kvbridge.models.schemes import schemes

    schemes(host)
    err = capsys.readouterr().err
    called = [
        "kvbridge_register_families",
        "kvbridge_register_rope_variants",
        "kvbridge_register_fitters",
        "kvbridge_register_metrics",
        "kvbridge_register_engines",
        "kvbridge_check_compatibility",
        "kvbridge_manifest_dirs",
        "kvbridge_resolve_family",
        "kvbridge_register_commands",
        "kvbridge_register_model_sources",
        "kvbridge_register_steering_methods",
        "kvbridge_register_scorers",
        "kvbridge_register_tasks",
    ]
    assert set(called) == {n for n in dir(hookspecs) if n.startswith("kvbridge_")}
    for name in called:
        assert f"[kvbridge-plugins] {name} [hook]" in err or f"{name} [hook]" in err, (name, err[:400])


def test_wrapper_implementations_are_refused_naming_the_plugin():
    class NewStyle:
        @hookimpl(wrapper=True)
        def kvbridge_register_fitters(self, register):
            return (yield)

    class OldStyle:
        @hookimpl(hookwrapper=True)
        def kvbridge_check_compatibility(self, source, target):
            yield

    host = plugins_mod.make_host(entry_points=False, extra=[("wrapping", NewStyle()), ("oldwrap", OldStyle())])
    for name, flag in (("wrapping", "wrapper=True"), ("oldwrap", "hookwrapper=True")):
        rec = host.record(name)
        assert rec.error.startswith(f"plugin {name!r}:") and flag in rec.error and "\n" not in rec.error
        assert host.pm.get_plugin(name) is None  # not registered: it cannot change any result
    assert "identity" in host.registry("fitter").names()
    assert not [f for f in host.check_findings(None, None) if f.plugin == "oldwrap"]


def test_every_hook_goes_through_the_error_record():
    class Broken:
        @hookimpl
        def kvbridge_manifest_dirs(self):
            raise OSError("disk on fire")

    class Fine:
        @hookimpl
        def kvbridge_manifest_dirs(self):
            return ["/tmp/kvbridge-manifests-a", "/tmp/kvbridge-manifests-b"]

    host = plugins_mod.make_host(entry_points=False, extra=[("broken", Broken()), ("fine", Fine())])
    from kvbridge.check.sources import REPO_MANIFESTS

    dirs = host.manifest_dirs()  # kvbridge's own folder comes first (a built-in, tryfirst), then plugins'
    assert [str(d) for d in dirs] == [str(REPO_MANIFESTS), "/tmp/kvbridge-manifests-a", "/tmp/kvbridge-manifests-b"]
    assert host.record("broken").error == "kvbridge_manifest_dirs failed: OSError: disk on fire"
    # a direct pm.hook call gets the same guard (kvbridge.check.sources calls it that way)
    assert host.pm.hook.kvbridge_manifest_dirs() == [
        [REPO_MANIFESTS],
        ["/tmp/kvbridge-manifests-a", "/tmp/kvbridge-manifests-b"],
    ]

    class BrokenCommands:
        @hookimpl
        def kvbridge_register_commands(self, cli):
            raise RuntimeError("no cli for you")

    import click

    host = plugins_mod.make_host(entry_points=False, extra=[("cmds", BrokenCommands())])
    host.register_commands(click.Group())
    assert "no cli for you" in host.record("cmds").error


def test_a_fitter_missing_a_protocol_member_is_refused_at_registration():
    class NoOptions:
        name = "no-options"

        def fit(self, source_spec, target_spec, calibration, options):
            return None

    class Registers:
        @hookimpl
        def kvbridge_register_fitters(self, register):
            register(Fitter(name="no-options", description="d", factory=NoOptions))

    host = plugins_mod.make_host(entry_points=False, extra=[("halfdone", Registers())])
    assert "no-options" not in host.registry("fitter").names()
    err = host.record("halfdone").error
    assert err.startswith("plugin 'halfdone': fitter 'no-options'") and "missing member 'Options'" in err

    class Lazy:  # a lazy factory is checked when it loads: a one-line error naming plugin and member
        @hookimpl
        def kvbridge_register_fitters(self, register):
            register(Fitter(name="lazy", description="d", factory="builtins:dict"))

    host = plugins_mod.make_host(entry_points=False, extra=[("lazyplugin", Lazy())])
    with pytest.raises(PluginError, match="fitter 'lazy' of plugin 'lazyplugin'.*missing member 'name'"):
        host.get("fitter", "lazy")


def test_model_sources_hook_goes_through_the_host(tmp_path):
    from kvbridge.models.schemes import schemes

    class Team:
        @hookimpl
        def kvbridge_register_model_sources(self, register):
            register("team", lambda name: tmp_path / name, "our shared folder")

    class Broken:
        @hookimpl
        def kvbridge_register_model_sources(self, register):
            raise RuntimeError("registry offline")

    host = plugins_mod.make_host(entry_points=False, extra=[("team", Team()), ("broken", Broken())])
    found = schemes(host)
    assert found["team"].plugin == "team" and found["team"].resolver("x") == tmp_path / "x"
    assert "zoo" in found and "registry offline" in host.record("broken").error


def test_plugins_command_shows_a_plugin_whose_manifest_hook_raises(monkeypatch):
    from kvbridge.cli.main import cli

    class Broken:
        @hookimpl
        def kvbridge_manifest_dirs(self):
            raise OSError("disk on fire")

    host = plugins_mod.make_host(entry_points=False, extra=[("brokenmanifests", Broken())])
    monkeypatch.setattr(plugins_mod, "_DEFAULT", host)
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    rows = {p["name"]: p for p in json.loads(result.output)["plugins"]}
    assert rows["brokenmanifests"]["error"] == "kvbridge_manifest_dirs failed: OSError: disk on fire"


def test_one_lookup_for_every_kind_and_one_error_shape():
    host = plugins_mod.make_host(entry_points=False)
    assert host.get("fitter", "identity").name == "identity"  # an instance, loaded and checked
    assert callable(host.get("scorer", "bullets")) and host.get("rope_variant", "default").name == "default"
    for kind, name in (("fitter", "ridg"), ("metric", "nlll"), ("task", "recal"), ("engine", "llamacp")):
        with pytest.raises(PluginError) as info:
            host.get(kind, name)
        text = str(info.value)
        assert text.startswith(f"unknown {plugins_mod.KINDS[kind][0]} {name!r}; known: ") and "did you mean" in text
        assert plugins_mod.KINDS[kind][1] in text  # the fix names the hook that registers one
    with pytest.raises(PluginError, match="unknown plugin kind 'fiter'; known: family, rope_variant"):
        host.get("fiter", "ridge")
