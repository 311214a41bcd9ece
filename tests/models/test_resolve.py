"""Model references: schemes, short names, GGUF folders, plugin-registered sources."""

from __future__ import annotations

import pytest

from kvbridge.errors import ConfigError
from kvbridge.hookspecs import hookimpl
from kvbridge.models import ModelRef, resolve
from kvbridge.plugins import make_host
from tests.gguf_files import tiny_llama_gguf


def test_zoo_scheme_and_errors():
    ref = resolve("zoo:base")
    assert ref.kind == "zoo" and ref.name == "zoo:base" and ref.has_weights and ref.source == "zoo"
    with pytest.raises(ConfigError, match="no zoo model 'nope'"):
        resolve("zoo:nope")


def test_short_name_needs_a_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        resolve("smollm2")
    assert "kvbridge models fetch smollm2" in info.value.one_line()


def test_short_name_reads_the_cache(tmp_path, monkeypatch):
    from kvbridge.models.known import SMOLLM2

    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path))
    tiny_llama_gguf(SMOLLM2.path.parent.mkdir(parents=True) or SMOLLM2.path)
    ref = resolve("smollm2")
    assert ref.kind == "known" and ref.gguf_file == str(SMOLLM2.path) and ref.spec().num_layers == 2


def test_folder_holding_one_gguf(tmp_path):
    tiny_llama_gguf(tmp_path / "m.gguf")
    ref = resolve(str(tmp_path))
    assert ref.kind == "gguf" and ref.gguf_file.endswith("m.gguf") and ref.quantization == "Q4_1"
    tiny_llama_gguf(tmp_path / "n.gguf")
    with pytest.raises(ConfigError, match="2 .gguf files"):
        resolve(str(tmp_path))


def test_unknown_names_suggest_short_names():
    with pytest.raises(ConfigError, match="did you mean smollm2"):
        resolve("smollm")


class _Team:
    def __init__(self, folder):
        self.folder = folder

    @hookimpl
    def kvbridge_register_model_sources(self, register):
        register("team", lambda rest: self.folder / rest, "our models")
        register(
            "teamref",
            lambda rest: ModelRef(ref=rest, kind="plugin", name=rest, config={"model_type": "llama"}, path="memory"),
        )


class _Broken:
    @hookimpl
    def kvbridge_register_model_sources(self, register):
        register("zoo", lambda rest: rest)


class _Raises:
    @hookimpl
    def kvbridge_register_model_sources(self, register):
        register("oops", lambda rest: 1 / 0)


def test_plugin_schemes(tmp_path):
    tiny_llama_gguf(tmp_path / "ft" / "m.gguf") if (tmp_path / "ft").mkdir() is None else None
    host = make_host(entry_points=False, extra=[("team-plugin", _Team(tmp_path))])
    ref = resolve("team:ft", host=host)
    assert ref.kind == "plugin" and ref.source == "team" and ref.gguf_file and ref.name == "team:ft"
    assert resolve("teamref:x", host=host).path == "memory"
    # a plugin taking a built-in scheme is disabled (one warning naming it); the built-in keeps working
    bad_host = make_host(entry_points=False, extra=[("bad", _Broken())])
    assert resolve("zoo:base", host=bad_host).name.endswith("base")
    assert "already provides" in bad_host.record("bad").error
    with pytest.raises(ConfigError, match="model source 'oops'.*ZeroDivisionError"):
        resolve("oops:x", host=make_host(entry_points=False, extra=[("raises", _Raises())]))
