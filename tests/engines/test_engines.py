"""The engine plugin kind: a third party's engine registers through the same hook as llamacpp."""

from __future__ import annotations

import pytest

from kvbridge.errors import PluginError
from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Engine
from kvbridge.plugins import make_host


class _Echo:
    name = "echo"

    def export_state(self, state, model, out=None, **options):
        return b"echo"

    def import_state(self, src, model, **options):
        return src


class _Plugin:
    @hookimpl
    def kvbridge_register_engines(self, register):
        register(Engine("echo", "returns what it gets", _Echo(), ".echo"))


class _Broken:
    @hookimpl
    def kvbridge_register_engines(self, register):
        register(Engine("half", "no import_state", type("Half", (), {"name": "half", "export_state": None})()))


class _Lazy:
    @hookimpl
    def kvbridge_register_engines(self, register):
        register(Engine("lazy", "a path to something that is not an engine", "kvbridge.errors:ConfigError"))


def test_a_third_party_engine_registers_beside_the_builtin_one():
    host = make_host(entry_points=False, extra=[("echoplugin", _Plugin())])
    assert host.names("engine") == ["echo", "llamacpp"]
    assert host.get("engine", "echo").export_state(None, None) == b"echo"
    rec = next(r for r in host.records if r.name == "echoplugin")
    assert rec.registers == {"engine": ["echo"]}
    with pytest.raises(PluginError, match="unknown engine 'llamacp'.*did you mean llamacpp"):
        host.get("engine", "llamacp")


def test_an_engine_missing_a_member_is_refused_naming_the_plugin():
    host = make_host(entry_points=False, extra=[("broken", _Broken()), ("lazy", _Lazy())])
    rec = next(r for r in host.records if r.name == "broken")
    host.registry("engine")
    assert "engine 'half' does not follow the protocol: missing member 'import_state'" in rec.error
    with pytest.raises(PluginError, match="engine 'lazy' of plugin 'lazy' does not follow the protocol"):
        host.get("engine", "lazy")


def test_the_builtin_engines_plugin_imports_nothing_heavy():
    import subprocess
    import sys

    code = "import sys, kvbridge.builtin.engines; assert 'torch' not in sys.modules and 'llama_cpp' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
